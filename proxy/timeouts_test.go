package proxy

import (
	"strings"
	"testing"
	"time"
)

// vLLM sends a stream's headers at once and its first event after the
// engine queue and prefill: that wait is first_byte's, not idle's; idle
// bounds the gaps after it.
func TestStreamTimeoutsFirstByteThenIdle(t *testing.T) {
	tests := []struct {
		name         string
		prefill, gap time.Duration
		firstByte    time.Duration
		errCode      string // of the stream's error event; "" for a clean stream
		errMsg       string // in the error event's message: which timeout fired
	}{
		{"first event later than idle, within first_byte", 400 * time.Millisecond, 0, 5 * time.Second, "", ""},
		{"gap after the first event longer than idle", 0, 400 * time.Millisecond, 5 * time.Second, "upstream_timeout", "no stream event for 150ms"},
		{"first event later than first_byte", 900 * time.Millisecond, 0, 300 * time.Millisecond, "upstream_timeout", "no first stream event within 300ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newFakeVLLM(t)
			up.tokens, up.prefill, up.gap = 3, tt.prefill, tt.gap
			tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) {
				c.IdleTimeout, c.FirstByteTimeout = 150*time.Millisecond, tt.firstByte
			}))
			resp := post(t, tr.url+"/v1/chat/completions", chatStream)
			defer resp.Body.Close()
			evs := sseEvents(t, resp.Body)
			if len(evs) == 0 || evs[len(evs)-1] != "[DONE]" {
				t.Fatalf("stream did not end with [DONE]: %q", evs)
			}
			var got string
			for _, e := range evs {
				if strings.HasPrefix(e, `{"error"`) {
					got = e
				}
			}
			if (tt.errCode == "") != (got == "") || !strings.Contains(got, tt.errCode) || !strings.Contains(got, tt.errMsg) {
				t.Fatalf("error event %q, want code %q and %q", got, tt.errCode, tt.errMsg)
			}
		})
	}
}
