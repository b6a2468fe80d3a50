package proxy

import (
	"io"
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestAppendIPMatchesString(t *testing.T) {
	for _, s := range []string{"127.0.0.1", "::1", "2001:db8::68", "10.1.2.3"} {
		ip := net.ParseIP(s) // 16 bytes, IPv4 ones mapped
		if got := string(appendIP(nil, ip)); got != ip.String() {
			t.Errorf("%s: %q, want %q", s, got, ip.String())
		}
		if v4 := ip.To4(); v4 != nil {
			if got := string(appendIP(nil, v4)); got != s {
				t.Errorf("%s in 4 bytes: %q", s, got)
			}
		}
	}
	if got := string(appendIP(nil, nil)); got != "<nil>" {
		t.Errorf("nil: %q, want net.IP's <nil>", got)
	}
}

func TestForwardedForChain(t *testing.T) {
	var h fasthttp.RequestHeader
	ip := net.ParseIP("10.0.0.9")
	if got := string(appendForwardedFor(nil, &h, ip)); got != "10.0.0.9" {
		t.Errorf("no chain: %q", got)
	}
	h.Add("X-Forwarded-For", "203.0.113.7")
	h.Add("x-forwarded-for", " 198.51.100.2, 192.0.2.1 ")
	h.Add("X-Forwarded-For", "")
	if got := string(appendForwardedFor(nil, &h, ip)); got != "203.0.113.7, 198.51.100.2, 192.0.2.1, 10.0.0.9" {
		t.Errorf("chain: %q", got)
	}
}

// The engine learns the client's address after the chain it came through.
func TestForwardedForReachesTheEngine(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouter(t, []string{up.url})
	for _, tt := range []struct{ sent, want string }{
		{"", "127.0.0.1"},
		{"203.0.113.7", "203.0.113.7, 127.0.0.1"},
	} {
		var hdr []string
		if tt.sent != "" {
			hdr = []string{"X-Forwarded-For", tt.sent}
		}
		resp := post(t, tr.url+"/v1/chat/completions", chatPlain, hdr...)
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		if got := (<-up.received).Header.Get("X-Forwarded-For"); resp.StatusCode != 200 || got != tt.want {
			t.Errorf("sent %q: %d, the engine got %q, want %q", tt.sent, resp.StatusCode, got, tt.want)
		}
	}
}
