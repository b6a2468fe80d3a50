package proxy

import (
	"testing"
	"time"
)

// A stream may outlive the server's ReadTimeout (the slowloris guard for
// reading requests): the disconnect watch must not mistake the expired
// read deadline for a vanished client.
func TestStreamOutlivesReadTimeout(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens, up.gap = 20, 40*time.Millisecond // ~0.8 s of stream
	tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) { c.ReadTimeout = 200 * time.Millisecond }))
	resp := post(t, tr.url+"/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	evs := sseEvents(t, resp.Body)
	if len(evs) < 21 || evs[len(evs)-1] != "[DONE]" {
		t.Fatalf("stream cut: %d events, last %q", len(evs), evs[len(evs)-1])
	}
	if up.canceled.Load() != 0 {
		t.Fatal("upstream was aborted")
	}
	waitFor(t, "finish", func() bool { return tr.srv.Active() == 0 })
	if recs := tr.srv.records.Since(0, 0); recs[0].Outcome != "ok" {
		t.Fatalf("outcome %s", recs[0].Outcome)
	}
}
