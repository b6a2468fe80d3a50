//go:build linux

package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/prefixcache"
)

// The suite runs on the request loops, the default on Linux: API requests,
// whole and streamed, are served by the loops, the rest handed off
// (TestRequestLoopServesWholeRequests). The
// behaviours that real engines and clients exercise run again on
// fasthttp's goroutine per connection (upstream.goroutine_requests), so
// that both paths are held to them; GPUROUTER_TEST_GOROUTINE_REQUESTS=1
// runs the whole suite so.
func TestGoroutineRequestsKeepTheRequestPathsBehaviours(t *testing.T) {
	t.Setenv("GPUROUTER_TEST_GOROUTINE_REQUESTS", "1")
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"ConnectionClosedAfterEveryResponseIsResent", TestConnectionClosedAfterEveryResponseIsResent},
		{"EngineRefusalReachesTheClientAsARateLimit", TestEngineRefusalReachesTheClientAsARateLimit},
		{"EngineRetryAfterInLowerCase", TestEngineRetryAfterInLowerCase},
		{"KilledReplicasGive503NotBadGateway", TestKilledReplicasGive503NotBadGateway},
		{"NoClientMessageCarriesLibraryInternals", TestNoClientMessageCarriesLibraryInternals},
		{"ErrorStatusesHaveOpenAIShape", TestErrorStatusesHaveOpenAIShape},
		{"RetryBeforeFirstByteLandsOnAnotherReplica", TestRetryBeforeFirstByteLandsOnAnotherReplica},
		{"BreakerOpensAndReplicaStopsReceivingTraffic", TestBreakerOpensAndReplicaStopsReceivingTraffic},
		{"HeadersAndRequestID", TestHeadersAndRequestID},
		{"RouterEndpoints", TestRouterEndpoints},
		{"WholeAnswerBeforeAccounting", TestWholeAnswerBeforeAccounting},
		{"WholeResponseToAClientThatStopsReadingEnds", TestWholeResponseToAClientThatStopsReadingEnds},
		{"StreamConnectionServesTheNextRequests", TestStreamConnectionServesTheNextRequests},
		{"ClientDisconnectAbortsUpstream", TestClientDisconnectAbortsUpstream},
		{"StreamLoopAfterAnInformationalHead", TestStreamLoopAfterAnInformationalHead},
	} {
		t.Run(tc.name, tc.f)
	}
}

// Whole requests are the loop's: none is handed off, and they share the
// loop's keep-alive engine connection. So are streams' requests: each
// stream goes to the stream loop with the loop's engine connection, and
// comes back with it once ended, for the requests that follow.
func TestRequestLoopServesWholeRequests(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouter(t, []string{up.url}, oneLoop)
	handOffs := func() float64 { return testutil.ToFloat64(tr.srv.m.loopHandOffs) }
	if len(tr.srv.reqLoops) != 1 {
		t.Fatalf("%d request loops; want 1", len(tr.srv.reqLoops))
	}
	for i := range 20 {
		if st, _, b := call(t, tr.url, chatPlain); st != 200 {
			t.Fatalf("request %d: status %d: %.200s", i, st, b)
		}
	}
	if n := handOffs(); n != 0 {
		t.Fatalf("%v connections handed off for whole requests; want 0", n)
	}
	conns := 0
	up.apiConns.Range(func(any, any) bool { conns++; return true })
	if conns != 1 {
		t.Errorf("20 sequential requests came on %d engine connections; want 1 (kept alive)", conns)
	}
	for i := range 3 {
		if st, done, b := call(t, tr.url, chatStream); st != 200 || !done {
			t.Fatalf("stream %d: status %d complete=%v: %.200s", i, st, done, b)
		}
		if st, _, b := call(t, tr.url, chatPlain); st != 200 {
			t.Fatalf("request after stream %d: status %d: %.200s", i, st, b)
		}
	}
	if n := handOffs(); n != 0 {
		t.Errorf("%v hand-offs after streams; want 0", n)
	}
	if in, end := testutil.ToFloat64(tr.srv.m.loopIn), exitsOf(tr, "end"); in != 3 || end != 3 {
		t.Errorf("%v streams into the stream loop, %v ended there; want 3 and 3", in, end)
	}
	conns = 0
	up.apiConns.Range(func(any, any) bool { conns++; return true })
	if conns != 1 {
		t.Errorf("requests and streams came on %d engine connections; want 1 (kept alive)", conns)
	}
	waitFor(t, "every request finished", func() bool { return tr.srv.Active() == 0 && tr.srv.streams.Load() == 0 })
}

// Requests a client sends without waiting for the answers (pipelining)
// are answered in order on the connection, each once — one the loop
// refuses at once among them, one split across reads.
func TestRequestLoopPipelinedRequests(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouter(t, []string{up.url}, oneLoop)
	c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := func(id, body string) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nX-Request-Id: " + id +
			"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	unknown := `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`
	split := req("fourth", chatPlain)
	sends := []string{req("first", chatPlain) + req("refused", unknown) + req("third", chatPlain) + split[:40], split[40:]}
	for _, s := range sends {
		if _, err := io.WriteString(c, s); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
	br := bufio.NewReader(c)
	for _, want := range []struct {
		id     string
		status int
	}{{"first", 200}, {"refused", 404}, {"third", 200}, {"fourth", 200}} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer to %s: %v", want.id, err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		if resp.StatusCode != want.status || resp.Header.Get("X-Request-Id") != want.id {
			t.Fatalf("answer %d %q, want %d for %q", resp.StatusCode, resp.Header.Get("X-Request-Id"), want.status, want.id)
		}
	}
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond)) //nolint:errcheck
	if n, err := br.Read(make([]byte, 1)); err == nil {
		t.Fatalf("%d bytes more than the four answers", n)
	}
	if n := up.requests.Load(); n != 3 {
		t.Errorf("the engine got %d requests; want 3", n)
	}
	if n := testutil.ToFloat64(tr.srv.m.loopHandOffs); n != 0 {
		t.Errorf("%v hand-offs; want 0", n)
	}
}

// A client that leaves while the engine works ends its request: the
// engine's connection closes (the engine stops), and the exchange is
// finished as canceled.
func TestRequestLoopClientGoneWhileTheEngineWorks(t *testing.T) {
	up := newFakeVLLM(t)
	up.hang = true
	tr := startRouter(t, []string{up.url}, oneLoop)
	c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: "+strconv.Itoa(len(chatPlain))+"\r\n\r\n"+chatPlain) //nolint:errcheck
	waitFor(t, "the engine got the request", func() bool { return up.requests.Load() == 1 })
	c.Close()
	waitFor(t, "the engine saw the router leave", func() bool { return up.canceled.Load() == 1 })
	waitFor(t, "the request finished", func() bool { return tr.srv.Active() == 0 })
	if n := testutil.ToFloat64(tr.srv.m.requests.WithLabelValues("m", "r0", "round_robin", "499", "canceled")); n != 1 {
		t.Errorf("canceled requests counted %v; want 1", n)
	}
}

// With goroutine requests, no loop runs: nothing is handed off.
func TestGoroutineRequestsRunNoLoop(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) { c.GoroutineRequests = true }))
	if st, _, b := call(t, tr.url, chatPlain); st != 200 {
		t.Fatalf("status %d: %.200s", st, b)
	}
	if len(tr.srv.reqLoops) != 0 || testutil.ToFloat64(tr.srv.m.loopHandOffs) != 0 {
		t.Fatalf("%d request loops, %v hand-offs; want none", len(tr.srv.reqLoops), testutil.ToFloat64(tr.srv.m.loopHandOffs))
	}
}

// oneLoop is a test router with one request loop, whatever
// GPUROUTER_TEST_GOROUTINE_REQUESTS says.
var oneLoop = withConfig(func(c *Config) { c.RequestLoops, c.GoroutineRequests = 1, false })

// The engine gets the same request from a loop as from the goroutine
// path: the client's headers less the hop-by-hop ones and those the
// Connection header names, the router's own (id, number, the
// X-Forwarded-For chain), the same body.
func TestRequestLoopSendsTheEngineTheSameRequest(t *testing.T) {
	raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nUser-Agent: OpenAI/Python 1.54.0\r\n" +
		"Connection: keep-alive, X-Hop\r\nX-Hop: gone\r\nAccept-Encoding: gzip\r\nX-Forwarded-For: 10.0.0.1\r\nX-Request-Id: same-id\r\n" +
		"X-Custom: kept\r\nAuthorization: Bearer engine-key\r\nContent-Length: " + strconv.Itoa(len(chatPlain)) + "\r\n\r\n" + chatPlain
	sent := func(goroutines bool) (http.Header, string) {
		up := newFakeVLLM(t)
		tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) { c.RequestLoops, c.GoroutineRequests = 1, goroutines }))
		c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, raw)                             //nolint:errcheck
		c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("goroutines=%v: status %d", goroutines, resp.StatusCode)
		}
		return <-up.headers, string(<-up.bodies)
	}
	gh, gb := sent(true)
	lh, lb := sent(false)
	if gb != lb {
		t.Errorf("bodies differ:\ngoroutine %s\nloop      %s", gb, lb)
	}
	for _, h := range []http.Header{gh, lh} {
		if h.Get("X-Hop") != "" || h.Get("Accept-Encoding") != "" || h.Get("X-Custom") != "kept" ||
			h.Get("X-Request-Id") != "same-id" || h.Get("X-Forwarded-For") != "10.0.0.1, 127.0.0.1" {
			t.Errorf("engine got %v", h)
		}
	}
	if !reflect.DeepEqual(gh, lh) {
		t.Errorf("headers differ:\ngoroutine %v\nloop      %v", gh, lh)
	}
}

// A drain lets a whole request in a loop finish — its answer says
// Connection: close — and closes the loop's idle connections; past the
// drain deadline, a request still waiting for its engine ends with 503 and
// its engine connection closes.
func TestRequestLoopDrain(t *testing.T) {
	for _, late := range []bool{false, true} {
		up := newFakeVLLM(t)
		up.prefill = 300 * time.Millisecond
		if late {
			up.hang = true
		}
		tr := startRouter(t, []string{up.url}, oneLoop)
		idle, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer idle.Close()
		waitFor(t, "the idle connection in the loop", func() bool { return tr.srv.loopClients() == 1 })
		got := make(chan *http.Response, 1)
		go func() {
			req, _ := http.NewRequest("POST", tr.url+"/v1/chat/completions", strings.NewReader(chatPlain))
			resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
			if err != nil {
				t.Error(err)
				got <- nil
				return
			}
			io.Copy(io.Discard, resp.Body) //nolint:errcheck
			resp.Body.Close()
			got <- resp
		}()
		waitFor(t, "the engine got the request", func() bool { return up.requests.Load() == 1 })
		deadline := 5 * time.Second
		if late {
			deadline = 150 * time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		err = tr.srv.Shutdown(ctx)
		cancel()
		if err != nil {
			t.Fatalf("late=%v: Shutdown: %v", late, err)
		}
		resp := <-got
		switch {
		case resp == nil:
		case !late && (resp.StatusCode != 200 || !resp.Close):
			t.Errorf("drained request: status %d, close %v; want 200 with Connection: close", resp.StatusCode, resp.Close)
		case late && resp.StatusCode != 503:
			t.Errorf("request past the drain deadline: status %d; want 503", resp.StatusCode)
		}
		idle.SetReadDeadline(time.Now().Add(2 * time.Second)) //nolint:errcheck
		if n, err := idle.Read(make([]byte, 1)); err == nil {
			t.Errorf("late=%v: the idle connection is still open (read %d bytes)", late, n)
		}
		if late {
			waitFor(t, "the engine saw the router leave", func() bool { return up.canceled.Load() == 1 })
		}
		if n := tr.srv.Active(); n != 0 {
			t.Errorf("late=%v: %d requests still active", late, n)
		}
	}
}

// A client's X-Request-Id comes back as it was sent, on both paths; one
// with a line break in it (a lone CR) is refused by the parser or comes
// back with a space, never as a break in the router's answer.
func TestRequestIDEchoedWithoutLineBreaks(t *testing.T) {
	for _, goroutines := range []bool{false, true} {
		up := newFakeVLLM(t)
		tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) { c.RequestLoops, c.GoroutineRequests = 1, goroutines }))
		for id, want := range map[string]string{"abc-123": "abc-123", "a\rb": "a b"} {
			c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nConnection: close\r\nX-Request-Id: "+id+"\r\nContent-Length: "+strconv.Itoa(len(chatPlain))+"\r\n\r\n"+chatPlain) //nolint:errcheck
			c.SetReadDeadline(time.Now().Add(5 * time.Second))                                                                                                                                    //nolint:errcheck
			b, _ := io.ReadAll(c)
			c.Close()
			end := strings.Index(string(b), "\r\n\r\n")
			if end < 0 {
				t.Fatalf("goroutines=%v id %q: no answer: %q", goroutines, id, b)
			}
			h := string(b[:end])
			if strings.Count(h, "\r") != strings.Count(h, "\r\n") {
				t.Errorf("goroutines=%v id %q: a lone CR in the answer's head %q", goroutines, id, h)
			}
			if strings.HasPrefix(h, "HTTP/1.1 200") && !strings.Contains(h, "\r\nX-Request-Id: "+want+"\r\n") {
				t.Errorf("goroutines=%v id %q: head %q", goroutines, id, h)
			}
		}
	}
}

// An engine that answers the HTTP/1.0 way — no length, the body to the
// connection's close — is read to the close by a loop, as by fasthttp's
// client; its connection is not kept.
func TestRequestLoopResponseToTheClose(t *testing.T) {
	body := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	for _, status := range []string{"HTTP/1.0 200 OK", "HTTP/1.1 200 OK"} {
		up := rawUpstream(t, status+"\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"+body)
		for _, goroutines := range []bool{false, true} {
			tr := startRouter(t, []string{up}, withConfig(func(c *Config) { c.RequestLoops, c.GoroutineRequests = 1, goroutines }))
			for i := range 3 {
				st, _, b := call(t, tr.url, chatPlain)
				if st != 200 || !strings.Contains(b, `"content":"hi"`) {
					t.Fatalf("%s, goroutines=%v, request %d: status %d: %.200s", status, goroutines, i, st, b)
				}
			}
		}
	}
}

// A pool with a replica behind TLS, which the loop does not speak, has
// its requests handed to fasthttp's path, which answers for the replica
// (here one that speaks no TLS: an error).
func TestRequestLoopHandsOffTLSPools(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouter(t, []string{"https://" + strings.TrimPrefix(up.url, "http://")}, oneLoop)
	if st, _, b := call(t, tr.url, chatPlain); st < 500 {
		t.Fatalf("status %d from a replica that speaks no TLS: %.200s", st, b)
	}
	if n := testutil.ToFloat64(tr.srv.m.loopHandOffs); n != 1 {
		t.Errorf("%v hand-offs; want 1", n)
	}
}

// A loop with nothing in progress sleeps until its first idle connection
// expires, or until woken when it holds none, rather than waking every
// scan period: each wake-up of its thread costs the runtime a P hand-off
// and sets its monitor polling. A request in progress brings the scans back.
func TestRequestLoopSleepsWhileQuiet(t *testing.T) {
	tr := startRouter(t, []string{newFakeVLLM(t).url}, oneLoop)
	if st, _, b := call(t, tr.url, chatPlain); st != 200 { // serving: its Shutdown then stops it
		t.Fatalf("status %d: %.200s", st, b)
	}
	l := newRequestLoop(tr.srv, nil) // not running: its state is the test's
	l.now = time.Unix(1000, 0)
	l.scan()
	if w := l.waitMillis(); w != -1 {
		t.Errorf("empty loop waits %d ms; want -1 (until woken)", w)
	}
	client := &loopConn{fd: 5, since: l.now}
	engine := &loopConn{fd: 6, up: &upstream{}, since: l.now.Add(-time.Second)}
	l.conns.Set(client.fd, client)
	l.conns.Set(engine.fd, engine)
	l.scan()
	want := tr.srv.cfg.MaxIdleConnTime - time.Second + time.Millisecond
	if w := l.waitMillis(); w != int(want/time.Millisecond) {
		t.Errorf("idle connections: waits %d ms; want %d (the engine connection's expiry)", w, want/time.Millisecond)
	}
	client.r = &loopReq{phase: phaseAdmitting}
	l.scan()
	if w := l.waitMillis(); w != int(reqLoopScan/time.Millisecond) {
		t.Errorf("a request in progress: waits %d ms; want %d", w, reqLoopScan/time.Millisecond)
	}
}

// An HTTP/1.0 engine that gives its answer's length and keeps the
// connection open is answered as soon as the body is in, on both paths,
// as fasthttp's client reads it: not when the engine closes, nor at a
// timeout.
func TestRequestLoopHTTP10WithLengthAnsweredAtItsEnd(t *testing.T) {
	body := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	reply := "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	up := loopbackServer(t, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		buf := make([]byte, 4096)
		c.Read(buf)              //nolint:errcheck // the request
		io.WriteString(c, reply) //nolint:errcheck
		// The connection stays open.
		time.Sleep(3 * time.Second)
	})
	for _, goroutines := range []bool{false, true} {
		tr := startRouter(t, []string{up}, withConfig(func(c *Config) { c.RequestLoops, c.GoroutineRequests = 1, goroutines }))
		start := time.Now()
		st, _, b := call(t, tr.url, chatPlain)
		if st != 200 || !strings.Contains(b, `"content":"hi"`) {
			t.Fatalf("goroutines=%v: status %d: %.200s", goroutines, st, b)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("goroutines=%v: answered after %v, when the engine's connection stayed open", goroutines, d)
		}
	}
}

// A pool whose prefix index is keyed by the engines' tokens has each
// prompt tokenized, tens of milliseconds for a long one: the loop hands
// its connections to fasthttp's goroutines rather than stall its other
// connections meanwhile. A text-keyed (approximate) index stays the
// loop's, and so does the pool again once its index changes back.
func TestRequestLoopHandsTokenizingPoolsOff(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouter(t, []string{up.url}, oneLoop)
	handOffs := func() float64 { return testutil.ToFloat64(tr.srv.m.loopHandOffs) }
	tok, err := prefixcache.NewBPE("")
	if err != nil {
		t.Fatal(err)
	}
	tokens := &balancer.PrefixCache{Index: prefixcache.NewIndex(), BlockSize: 16, Tokenizer: tok, Chat: prefixcache.CL100KChat()}
	text := &balancer.PrefixCache{Index: prefixcache.NewIndex(), BlockSize: prefixcache.DefaultBlockBytes, Approximate: true}
	for i, tc := range []struct {
		pc   *balancer.PrefixCache
		want float64 // hand-offs after this step's request
	}{{text, 0}, {tokens, 1}, {nil, 1}, {tokens, 2}, {text, 2}} {
		tr.pool.SetPrefixCache(tc.pc)
		// A new connection each time: a handed-off one stays fasthttp's.
		resp := post(t, tr.url+"/v1/chat/completions", chatPlain, "Connection", "close")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("step %d: status %d: %.200s", i, resp.StatusCode, b)
		}
		if n := handOffs(); n != tc.want {
			t.Fatalf("step %d: %v connections handed off; want %v", i, n, tc.want)
		}
	}
}
