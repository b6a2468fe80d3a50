//go:build linux

package proxy

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// An engine's event stream framed otherwise than in chunks — by its
// connection's close (HTTP/1.0), or by its length — reaches the client
// event by event and whole, on a request loop's stream (plainBody) as on
// fasthttp's path; the loop's does not keep the engine's connection.
func TestStreamFromAnEngineNotChunked(t *testing.T) {
	events := tokenEvent(0) + tokenEvent(1) + "data: [DONE]\n\n"
	for _, tc := range []struct{ name, head string }{
		{"to the close", "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"},
		{"by length", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: " + strconv.Itoa(len(events)) + "\r\n\r\n"},
	} {
		url := scriptedUpstream(t, tc.head+tokenEvent(0), tokenEvent(1), "data: [DONE]\n\n")
		for _, goroutines := range []bool{false, true} {
			tr := startRouter(t, []string{url}, withConfig(func(c *Config) { c.GoroutineRequests = goroutines }))
			for i := range 2 {
				toks, done := streamTokens(t, tr.url)
				if want := "tok0 ,tok1 "; strings.Join(toks, ",") != want || !done {
					t.Fatalf("%s, goroutines=%v, stream %d: tokens %q done %v, want %q and [DONE]", tc.name, goroutines, i, toks, done, want)
				}
			}
			waitFor(t, "the streams finished", func() bool { return tr.srv.Active() == 0 && tr.srv.streams.Load() == 0 })
			// fasthttp's client keeps a connection whose answer had a
			// length, which this engine then closes without saying so (a
			// stale connection, resent); the loop's stream keeps none.
			if n := testutil.ToFloat64(tr.srv.m.stale.WithLabelValues(tr.reps[0].Name())); n != 0 && !(goroutines && tc.name == "by length") {
				t.Errorf("%s, goroutines=%v: %v stale connections: a closed one was kept", tc.name, goroutines, n)
			}
		}
	}
}

// An engine that says it closes its connection after a chunked stream
// has it closed after the stream: the next request goes on a new one.
func TestStreamFromAnEngineThatClosesIsNotKept(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
	url := scriptedUpstream(t, head+chunk(tokenEvent(0)), chunk(tokenEvent(1)), chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	tr := startRouter(t, []string{url}, oneLoop)
	for i := range 3 {
		toks, done := streamTokens(t, tr.url)
		if want := "tok0 ,tok1 "; strings.Join(toks, ",") != want || !done {
			t.Fatalf("stream %d: tokens %q done %v, want %q and [DONE]", i, toks, done, want)
		}
	}
	if n := testutil.ToFloat64(tr.srv.m.stale.WithLabelValues(tr.reps[0].Name())); n != 0 {
		t.Errorf("%v stale connections: one the engine closed was kept", n)
	}
	if end := exitsOf(tr, "end"); end != 3 {
		t.Errorf("%v streams ended in the stream loop; want 3", end)
	}
}
