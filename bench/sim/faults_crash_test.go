package sim

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dialRefused reports whether a connect to addr is refused (nothing
// listens); a connect that succeeds is closed.
func dialRefused(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		_ = c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// TestFaultCrashBetweenRequests kills a replica while a client holds idle
// keep-alive connections to it, as a router's pool does.
func TestFaultCrashBetweenRequests(t *testing.T) {
	f := fastFleet(t, 1)
	r, u := f.Replicas()[0], f.URLs()[0]
	addr := strings.TrimPrefix(u, "http://")
	pooled := dialKeepAlive(t, u) // has served a request
	if resp, _ := pooled.do(t, "POST", "/v1/chat/completions", smallChat); resp.StatusCode != 200 {
		t.Fatalf("before the crash: %d", resp.StatusCode)
	}
	fresh := dialKeepAlive(t, u) // connected, never used

	r.Crash(2 * time.Second)

	for name, k := range map[string]*keepAliveConn{"pooled": pooled, "fresh": fresh} {
		if err := k.readAfterResponse(5 * time.Second); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s connection after the crash: %v, want a reset (ECONNRESET)", name, err)
		}
	}
	// The listener went before the connections: once they are reset, a
	// reconnect is refused at once, not accepted by the dying server.
	if !dialRefused(addr) {
		t.Error("connect after the crash was not refused")
	}
	waitFor(t, 5*time.Second, "replica back", func() bool { return !dialRefused(addr) })
	k := dialKeepAlive(t, u)
	if resp, body := k.do(t, "POST", "/v1/chat/completions", smallChat); resp.StatusCode != 200 {
		t.Errorf("after the restart: %d %s", resp.StatusCode, body)
	}
}

func TestFaultCrashEvery(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	addr := strings.TrimPrefix(u, "http://")
	got := setFaults(t, u, `{"crash_every_seconds":0.2,"crash_down_seconds":0.3}`)
	if got.CrashEverySeconds != 0.2 || got.CrashDownSeconds != 0.3 {
		t.Fatalf("faults read back as %+v", got)
	}
	// Down, up, and down again: it keeps dying.
	for i := range 2 {
		waitFor(t, 5*time.Second, "crash", func() bool { return dialRefused(addr) })
		waitFor(t, 5*time.Second, "restart", func() bool { return !dialRefused(addr) })
		t.Logf("crash %d and restart seen", i+1)
	}
	if err := f.Replicas()[0].SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	// A crash that began before the clear may still be under way.
	waitFor(t, 5*time.Second, "served after clearing", func() bool { return tryChat(u) == 200 })
}

// tryChat sends smallChat on a fresh connection: its status, or 0 when the
// connection failed.
func tryChat(baseURL string) int {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Post(baseURL+"/v1/chat/completions", "application/json", strings.NewReader(smallChat))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
