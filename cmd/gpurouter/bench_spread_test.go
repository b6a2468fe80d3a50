package main

import (
	"strings"
	"testing"
	"time"
)

// TestBenchSpreadsOverRepeatedBaseURL: --base-url given several times
// spreads the run round-robin over the servers (several routers behind one
// Service) and leaves out the router column, which one router alone cannot
// fill; --targets with it is refused.
func TestBenchSpreadsOverRepeatedBaseURL(t *testing.T) {
	a := startSSEUpstream(t, func(string) time.Duration { return time.Millisecond })
	b := startSSEUpstream(t, func(string) time.Duration { return time.Millisecond })
	args := append([]string{"bench", "--base-url", a.URL, "--base-url", b.URL}, smallWorkload(6)...)
	code, out, errOut := runCmd(t, args...)
	if code != 0 || !strings.Contains(out, "Successful requests:                     6") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if a.seen("") != 3 || b.seen("") != 3 {
		t.Fatalf("requests per server: %d and %d, want 3 and 3", a.seen(""), b.seen(""))
	}
	if !strings.Contains(errOut, "2 base URLs: no router or engine column") {
		t.Fatalf("stderr does not say why the router column is missing:\n%s", errOut)
	}

	for _, sub := range []string{"sweep", "ab"} {
		args := []string{"bench", sub, "--request-rates", "1", "--base-url", a.URL, "--base-url", b.URL, "--targets", "x=" + a.URL + ",y=" + b.URL}
		if sub == "ab" {
			args = []string{"bench", sub, "--base-url", a.URL, "--base-url", b.URL, "--targets", "x=" + a.URL + ",y=" + b.URL}
		}
		if code, _, errOut := runCmd(t, args...); code != 2 || !strings.Contains(errOut, "not both") {
			t.Fatalf("%s: exit %d, stderr:\n%s", sub, code, errOut)
		}
	}
}
