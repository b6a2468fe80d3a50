//go:build linux

package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/internal/netloop/looptest"
	"github.com/gpurouter/gpurouter/internal/openai"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// exitsOf reads gpurouter_stream_loop_exits_total for reason.
func exitsOf(tr *testRouter, reason string) float64 {
	return testutil.ToFloat64(tr.srv.m.loopOut.WithLabelValues(reason))
}

// streamTokens posts a chat stream and returns its token events' contents
// and whether it ended with [DONE].
func streamTokens(t *testing.T, url string) (tokens []string, done bool) {
	t.Helper()
	resp := post(t, url+"/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	for _, ev := range sseEvents(t, resp.Body) {
		switch {
		case ev == "[DONE]":
			done = true
		case strings.Contains(ev, `"error"`):
			tokens = append(tokens, "error: "+ev)
		case strings.Contains(ev, `"content":"tok`):
			i := strings.Index(ev, `"content":"`) + len(`"content":"`)
			tokens = append(tokens, ev[i:i+strings.IndexByte(ev[i:], '"')])
		}
	}
	return tokens, done
}

// Streams are relayed in the loop from head to [DONE], event by event, and
// the upstream connection a stream took from fasthttp serves the next
// request, as a pooled one would.
func TestStreamLoopRelaysAndReusesTheConnection(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens, up.gap = 5, 5*time.Millisecond
	tr := startRouter(t, []string{up.url})
	for i := 0; i < 3; i++ {
		toks, done := streamTokens(t, tr.url)
		if want := "tok0 ,tok1 ,tok2 ,tok3 ,tok4 "; strings.Join(toks, ",") != want || !done {
			t.Fatalf("stream %d: tokens %q done %v, want %q and [DONE]", i, toks, done, want)
		}
	}
	if in := testutil.ToFloat64(tr.srv.m.loopIn); in != 3 {
		t.Fatalf("%v streams entered the loop, want 3", in)
	}
	if end := exitsOf(tr, "end"); end != 3 {
		t.Fatalf("%v streams left the loop at their end, want 3", end)
	}
	n := 0
	up.apiConns.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Fatalf("three streams in a row came on %d connections, want 1", n)
	}
}

// scriptedUpstream is an engine written byte by byte: for each POST it sends
// script's pieces, pausing between them, then closes the connection.
func scriptedUpstream(t *testing.T, script ...string) string {
	return loopbackServer(t, func(c net.Conn) {
		engineConn(c, func() bool {
			for _, piece := range script {
				if _, err := io.WriteString(c, piece); err != nil {
					return false
				}
				time.Sleep(20 * time.Millisecond)
			}
			return false
		})
	})
}

// engineConn answers an engine connection's requests, each body read: a
// POST by post, which says whether the connection carries another; any
// other method with an empty 200 (the router's probes and scrapes).
func engineConn(c net.Conn, post func() bool) {
	enginePosts(c, func(*http.Request) bool { return post() })
}

// enginePosts is engineConn with each POST's request given to post.
func enginePosts(c net.Conn, post func(*http.Request) bool) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body) //nolint:errcheck
		if req.Method != http.MethodPost {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") //nolint:errcheck
			continue
		}
		if !post(req) {
			return
		}
	}
}

const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

func chunk(ev string) string { return strconv.FormatInt(int64(len(ev)), 16) + "\r\n" + ev + "\r\n" }

func tokenEvent(i int) string {
	return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok` + strconv.Itoa(i) + ` "}}]}` + "\n\n"
}

// An engine that sends its head and first event in one segment: the bytes
// past the head, which fasthttp never saw, are the loop's first read; an
// event split across two chunks, and a chunk holding two events, come out
// whole and in order.
func TestStreamLoopHeadWithTheFirstEvent(t *testing.T) {
	second := tokenEvent(1)
	url := scriptedUpstream(t,
		sseHead+chunk(tokenEvent(0)),
		chunk(second[:10]), chunk(second[10:]),
		chunk(tokenEvent(2)+tokenEvent(3)),
		chunk("data: [DONE]\n\n")+"0\r\n\r\n",
	)
	tr := startRouter(t, []string{url})
	toks, done := streamTokens(t, tr.url)
	if want := "tok0 ,tok1 ,tok2 ,tok3 "; strings.Join(toks, ",") != want || !done {
		t.Fatalf("tokens %q done %v, want %q and [DONE]", toks, done, want)
	}
	if in, end := testutil.ToFloat64(tr.srv.m.loopIn), exitsOf(tr, "end"); in != 1 || end != 1 {
		t.Fatalf("loop: %v in, %v out at the end; want 1 and 1", in, end)
	}
}

// Broken chunked framing is a broken upstream: the client gets what came
// before it, an error event and [DONE].
func TestStreamLoopBrokenFraming(t *testing.T) {
	url := scriptedUpstream(t, sseHead, chunk(tokenEvent(0)), "zz\r\nnot a chunk")
	tr := startRouter(t, []string{url})
	toks, done := streamTokens(t, tr.url)
	if len(toks) != 2 || toks[0] != "tok0 " || !strings.Contains(toks[1], "error") || !done {
		t.Fatalf("tokens %q done %v, want tok0, an error event and [DONE]", toks, done)
	}
	if n := exitsOf(tr, "upstream_error"); n != 1 {
		t.Fatalf("%v streams left the loop on an upstream error, want 1", n)
	}
}

// A client that leaves mid-stream ends the engine's sequence (its
// connection is closed) while the stream is in the loop: the loop sees the
// hang-up itself, the client watch's checks being paused meanwhile (an hour
// apart here, so only the loop can have seen it).
func TestStreamLoopClientLeaves(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens, up.gap = 200, 10*time.Millisecond
	tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) { c.DisconnectCheck = time.Hour }))
	resp := post(t, tr.url+"/v1/chat/completions", chatStream)
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ { // a few events: the stream is in the loop
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	resp.Body.Close()
	waitFor(t, "the engine to see the client leave", func() bool { return up.canceled.Load() == 1 })
	waitFor(t, "the stream to leave the loop", func() bool {
		return exitsOf(tr, "aborted")+exitsOf(tr, "client_gone") == 1
	})
}

// A stream waiting in the loop for its first event still ends at the total
// deadline (the paused client watch's other check), not at first_byte's.
func TestStreamLoopTotalDeadline(t *testing.T) {
	up := newFakeVLLM(t)
	up.prefill = 3 * time.Second
	tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) {
		c.TotalTimeout, c.FirstByteTimeout, c.DisconnectCheck = 300*time.Millisecond, 10*time.Second, time.Hour
	}))
	start := time.Now()
	toks, done := streamTokens(t, tr.url)
	if len(toks) != 1 || !strings.Contains(toks[0], "total request deadline") || !done {
		t.Fatalf("events %q done %v, want the total deadline's error event and [DONE]", toks, done)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the stream ended after %s, want soon after its 300ms total deadline", took)
	}
	if n := exitsOf(tr, "aborted"); n != 1 {
		t.Fatalf("%v streams aborted in the loop, want 1", n)
	}
}

// When the loop stops (the server's Serve returns at shutdown) the streams
// in it go on on their own goroutines, to their end.
func TestStreamLoopStopHandsStreamsBack(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens, up.gap = 20, 20*time.Millisecond
	tr := startRouter(t, []string{up.url})
	resp := post(t, tr.url+"/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 4; i++ {
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- tr.srv.Shutdown(ctx) }()
	evs := sseEvents(t, br)
	if len(evs) == 0 || evs[len(evs)-1] != "[DONE]" {
		t.Fatalf("stream did not end with [DONE] after the loop stopped: %q", evs)
	}
	n := 0
	for _, ev := range evs {
		if strings.Contains(ev, `"content":"tok`) {
			n++
		}
	}
	if n < 17 { // up to three were read above with the role chunk
		t.Fatalf("%d token events after the loop stopped, want the rest of 20", n)
	}
	if err := <-shut; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if s := exitsOf(tr, "stopped"); s != 1 {
		t.Fatalf("%v streams handed back as the loop stopped, want 1", s)
	}
}

// An informational head (103 Early Hints) before the response's own is
// not where the body starts: the stream's bytes after the real head are
// relayed, none lost to fasthttp's buffer.
func TestStreamLoopAfterAnInformationalHead(t *testing.T) {
	url := scriptedUpstream(t,
		"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"+sseHead+chunk(tokenEvent(0)),
		chunk(tokenEvent(1)),
		chunk("data: [DONE]\n\n")+"0\r\n\r\n",
	)
	tr := startRouter(t, []string{url})
	toks, done := streamTokens(t, tr.url)
	if want := "tok0 ,tok1 "; strings.Join(toks, ",") != want || !done {
		t.Fatalf("tokens %q done %v, want %q and [DONE]", toks, done, want)
	}
	if in := testutil.ToFloat64(tr.srv.m.loopIn); in != 1 {
		t.Fatalf("%v streams in the loop, want 1", in)
	}
}

// goroutine_streams: every stream on its own goroutine, none in the loop.
func TestGoroutineStreamsLeaveTheLoopOut(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) { c.GoroutineStreams = true }))
	toks, done := streamTokens(t, tr.url)
	if len(toks) != 5 || !done {
		t.Fatalf("tokens %q done %v, want 5 and [DONE]", toks, done)
	}
	if in := testutil.ToFloat64(tr.srv.m.loopIn); in != 0 {
		t.Fatalf("%v streams in the loop, want none", in)
	}
}

// Several loops share the streams served on fasthttp's path, new ones
// going to each in turn; each relays its own to the end.
func TestStreamLoopsShareTheStreams(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens, up.gap = 30, 20*time.Millisecond
	tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) { c.StreamLoops, c.GoroutineRequests = 3, true }))
	const streams = 6
	results := make(chan int, streams)
	for range streams {
		go func() {
			resp, err := http.Post(tr.url+"/v1/chat/completions", "application/json", strings.NewReader(chatStream))
			if err != nil {
				results <- -1
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			n := strings.Count(string(body), `"content":"tok`)
			if !strings.Contains(string(body), "[DONE]") {
				n = -n
			}
			results <- n
		}()
	}
	waitFor(t, "every stream in a loop", func() bool {
		var n int64
		for _, p := range tr.srv.pumps {
			n += p.size.Load()
		}
		return n == streams
	})
	mfs, err := tr.srv.gather.Gather()
	if err != nil {
		t.Fatal(err)
	}
	loops := 0
	for _, mf := range mfs {
		if mf.GetName() != "gpurouter_stream_loop_streams" {
			continue
		}
		for _, m := range mf.GetMetric() {
			loops++
			if n := m.GetGauge().GetValue(); n != streams/3 {
				t.Errorf("loop %s holds %v streams, want %d", m.GetLabel()[0].GetValue(), n, streams/3)
			}
		}
	}
	if loops != 3 {
		t.Errorf("gpurouter_stream_loop_streams has %d loops, want 3", loops)
	}
	for range streams {
		if n := <-results; n != 30 {
			t.Fatalf("a stream ended with %d token events (negative: no [DONE]), want 30", n)
		}
	}
}

// countingRawConn counts the loop's writes to a client socket.
type countingRawConn struct {
	syscall.RawConn
	writes int
}

func (c *countingRawConn) Write(f func(uintptr) bool) error {
	c.writes++
	return c.RawConn.Write(f)
}

// writeLog keeps each Write apart.
type writeLog struct{ writes []string }

func (w *writeLog) Write(b []byte) (int, error) {
	w.writes = append(w.writes, string(b))
	return len(b), nil
}

// A stream that ends cleanly leaves the loop with its last events unsent,
// and its goroutine writes them with the body's last chunk: one write(2)
// fewer a stream than the loop writing them and the goroutine the last
// chunk. A stream that ends without [DONE] has its last events written by
// the loop at once, as any others.
func TestStreamLoopLeavesTheLastEventsForTheLastChunk(t *testing.T) {
	for _, tc := range []struct {
		name, upstream string
		loopWrites     int
		final          string // the goroutine's write after the head
	}{
		{"done", chunk(tokenEvent(1)+"data: [DONE]\n\n") + "0\r\n\r\n", 0,
			chunk(tokenEvent(1)+"data: [DONE]\n\n") + "0\r\n\r\n"},
		{"no [DONE]", chunk(tokenEvent(1)) + "0\r\n\r\n", 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			craw, _, _ := looptest.RawPair(t)
			counted := &countingRawConn{RawConn: craw}
			m, err := newMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			s := &Server{cfg: Config{}.withDefaults(), now: time.Now}
			p := newStreamPump(s.cfg, m, nil, nil)
			p.at = time.Now()
			r := &relay{x: &exchange{s: s, ep: openai.Chat, received: time.Now()}, gotBody: true}
			d := &detachedBody{pump: p, r: r, client: counted, fd: -1, cfd: -1, to: &timeouts{idle: time.Minute}, back: make(chan pumpResult, 1)}
			d.write = d.writeFrame
			d.inPump = true
			r.body = d
			p.size.Add(1)
			p.deliver(d, []byte(tc.upstream), nil, p.at)
			res := <-d.back
			if res.readErr != io.EOF || counted.writes != tc.loopWrites {
				t.Fatalf("handed back with %v after %d loop writes; want EOF after %d", res.readErr, counted.writes, tc.loopWrites)
			}
			if tc.final == "" {
				return
			}
			r.afterRead(res.readErr) // as pumpStream does with what the loop handed back
			var w writeLog
			if err := r.writeChunked(&w, []byte("HEAD")); err != nil {
				t.Fatal(err)
			}
			if len(w.writes) != 2 || w.writes[0] != "HEAD" || w.writes[1] != tc.final {
				t.Fatalf("writes %q, want the head, then %q", w.writes, tc.final)
			}
		})
	}
}
