package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	dto "github.com/prometheus/client_model/go"
)

// Behaviours of engines nobody here wrote: connections closed after every
// response despite keep-alive, refusals with Retry-After, death between
// requests. The client must pay for none of them.

// call sends body and reports the status and whether a stream ended with
// [DONE] (a non-streamed 200 counts as complete).
func call(t *testing.T, url, body string) (int, bool, string) {
	t.Helper()
	resp := post(t, url+"/v1/chat/completions", body)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	done := resp.StatusCode == 200 && (!strings.Contains(body, `"stream":true`) || strings.HasSuffix(strings.TrimSpace(string(b)), "data: [DONE]"))
	return resp.StatusCode, done, string(b)
}

func TestConnectionClosedAfterEveryResponseIsResent(t *testing.T) {
	up := newFakeVLLM(t)
	up.closeAfter.Store(true)
	// The engine's close lags its answer by 2 ms, so the router meets
	// connections closed under a request it has written, and must resend
	// it, as it would meet them now and then without the lag.
	up.closeDelay = 2 * time.Millisecond
	// One failure would open the breaker of the only replica: every
	// request after it would fail. So all succeeding proves none counted.
	tr := startRouter(t, []string{up.url}, withBreaker(1))
	bodies := [2]string{chatPlain, chatStream}

	for i := range 200 {
		if st, done, b := call(t, tr.url, bodies[i%2]); st != 200 || !done {
			t.Fatalf("sequential request %d: status %d complete=%v: %.200s", i, st, done, b)
		}
	}
	for batch := range 25 {
		var wg sync.WaitGroup
		errs := make(chan string, 8)
		for j := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := http.Post(tr.url+"/v1/chat/completions", "application/json", strings.NewReader(bodies[j%2]))
				if err != nil {
					errs <- err.Error()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || (j%2 == 1 && !strings.HasSuffix(strings.TrimSpace(string(b)), "data: [DONE]")) {
					errs <- fmt.Sprintf("status %d: %.200s", resp.StatusCode, b)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatalf("batch %d: %s", batch, e)
		}
	}
	waitFor(t, "every exchange to finish", func() bool { return tr.srv.Active() == 0 })
	if n := up.requests.Load(); n != 400 {
		t.Errorf("the engine saw %d requests, want 400: a resend reached it twice or one was lost", n)
	}
	recs := tr.srv.records.Since(0, 0)
	if len(recs) != 400 {
		t.Fatalf("%d records, want 400", len(recs))
	}
	for _, r := range recs {
		if r.Attempts != 1 || r.Outcome != "ok" {
			t.Fatalf("record %+v: want one attempt, ok", r)
		}
	}
	if st := tr.reps[0].BreakerState(); st != "closed" {
		t.Errorf("breaker %s, want closed", st)
	}
	if len(tr.sleep()) != 0 {
		t.Errorf("backoff sleeps %v: a stale connection is no retry", tr.sleep())
	}
	var m dto.Metric
	if err := tr.srv.m.stale.WithLabelValues("r0").Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n == 0 {
		t.Error("no stale connection counted: the test exercised nothing")
	} else {
		t.Logf("%v requests resent on a fresh connection", n)
	}
}

func TestEngineRefusalReachesTheClientAsARateLimit(t *testing.T) {
	refusing := func() *fakeVLLM {
		f := newFakeVLLM(t)
		f.status, f.retryAfter = 429, "7"
		return f
	}
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d refusing replicas", n), func(t *testing.T) {
			var ups []*fakeVLLM
			var urls []string
			for range n {
				f := refusing()
				ups = append(ups, f)
				urls = append(urls, f.url)
			}
			tr := startRouter(t, urls)
			client := openai.NewClient(option.WithBaseURL(tr.url+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for i := range 3 {
				_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
					Model:    "m",
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")},
				})
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 {
					t.Fatalf("request %d: err %v, want a 429 openai.Error (the SDK's rate-limit error)", i, err)
				}
				ra := apiErr.Response.Header.Get("Retry-After")
				if ra == "" || ra > "7" || apiErr.Type != "rate_limit_error" || strings.Contains(apiErr.Message, "fasthttp") {
					t.Fatalf("request %d: Retry-After %q, type %q, message %q", i, ra, apiErr.Type, apiErr.Message)
				}
			}
			// The first request met each replica once; the later ones
			// were answered by the router while the replicas rest.
			for i, f := range ups {
				if got := f.requests.Load(); got != 1 {
					t.Errorf("refusing replica %d got %d requests during its Retry-After, want 1", i, got)
				}
			}
			for _, r := range tr.reps {
				if r.BreakerState() != "closed" {
					t.Errorf("%s breaker %s: a refusal is not a failure", r.Name(), r.BreakerState())
				}
			}
		})
	}
	t.Run("a replica with room takes the request", func(t *testing.T) {
		a, b, room := refusing(), refusing(), newFakeVLLM(t)
		tr := startRouter(t, []string{a.url, b.url, room.url}, withPolicy("round_robin"))
		for i := range 10 {
			if st, done, body := call(t, tr.url, chatStream); st != 200 || !done {
				t.Fatalf("request %d: status %d: %.200s", i, st, body)
			}
		}
		if room.requests.Load() != 10 || a.requests.Load() > 1 || b.requests.Load() > 1 {
			t.Errorf("requests: refusing %d and %d, with room %d; want at most 1, 1 and 10",
				a.requests.Load(), b.requests.Load(), room.requests.Load())
		}
	})
}

// uvicorn, vLLM's server, writes header names in lower case: its
// Retry-After must count as one.
func TestEngineRetryAfterInLowerCase(t *testing.T) {
	up := newFakeVLLM(t)
	up.status, up.retryAfter, up.lowerHeaders = 429, "37", true
	tr := startRouter(t, []string{up.url})
	for i := range 2 {
		resp := post(t, tr.url+"/v1/chat/completions", chatPlain)
		resp.Body.Close()
		if ra := resp.Header.Get("Retry-After"); resp.StatusCode != 429 || (ra != "37" && ra != "36") {
			t.Fatalf("request %d: %d with Retry-After %q, want 429 and the engine's 37 s", i, resp.StatusCode, ra)
		}
	}
	if n := up.requests.Load(); n != 1 {
		t.Errorf("the engine got %d requests during its Retry-After, want 1", n)
	}
}

func TestKilledReplicasGive503NotBadGateway(t *testing.T) {
	a, b := newFakeVLLM(t), newFakeVLLM(t)
	tr := startRouter(t, []string{a.url, b.url}, withPolicy("round_robin"))
	// Open pooled connections to both.
	for range 4 {
		if st, _, body := call(t, tr.url, chatPlain); st != 200 {
			t.Fatalf("warm-up: %d %s", st, body)
		}
	}
	a.srv.Close() // as SIGKILL: the listener and every connection gone
	b.srv.Close()
	for i := range 20 {
		start := time.Now()
		resp := post(t, tr.url+"/v1/chat/completions", chatPlain)
		took := time.Since(start)
		if resp.StatusCode != 503 {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("request %d after the kill: status %d, want 503: %s", i, resp.StatusCode, b)
		}
		e := decodeError(t, resp)
		resp.Body.Close()
		if e.Error.Code != "no_healthy_replica" || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(e.Error.Message, "unreachable") && !strings.Contains(e.Error.Message, "no healthy replica") {
			t.Fatalf("request %d: %+v (Retry-After %q)", i, e.Error, resp.Header.Get("Retry-After"))
		}
		t.Logf("request %d: 503 in %v: %s", i, took, e.Error.Message)
	}
	for _, r := range tr.reps {
		if r.Healthy() || r.BreakerState() != "closed" {
			t.Errorf("%s healthy=%v breaker=%s; want marked down, breaker untouched", r.Name(), r.Healthy(), r.BreakerState())
		}
	}
	// Why it is fast: nothing waited — no backoff before the next replica.
	if len(tr.sleep()) != 0 {
		t.Errorf("backoff sleeps %v", tr.sleep())
	}
}

// rawUpstream accepts connections and answers each with reply (then
// closes it); "" closes at once, before any response byte.
func rawUpstream(t *testing.T, reply string) string {
	return loopbackServer(t, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		buf := make([]byte, 4096)
		c.Read(buf) //nolint:errcheck // the request head (and body): enough to answer
		if reply != "" {
			io.WriteString(c, reply) //nolint:errcheck
		}
	})
}

// loopbackServer serves every connection on a loopback port with serve,
// on a goroutine of its own, closing it after; it stops with the test.
func loopbackServer(t testing.TB, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// clientMessages returns every error message a client can read in a
// response: an OpenAI error body's, or an error event's in a stream.
func clientMessages(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	docs := []string{string(body)}
	if strings.Contains(string(body), "data: ") {
		docs = nil
		for _, line := range strings.Split(string(body), "\n") {
			if p, ok := strings.CutPrefix(line, "data: "); ok {
				docs = append(docs, p)
			}
		}
	}
	for _, d := range docs {
		var e openAIError
		if json.Unmarshal([]byte(d), &e) == nil && e.Error.Message != "" {
			out = append(out, e.Error.Message)
		}
	}
	return out
}

// Every way a replica can fail a request, and what the client reads: plain
// words naming the cause, never a library's message. The log keeps that.
func TestNoClientMessageCarriesLibraryInternals(t *testing.T) {
	cut := newFakeVLLM(t)
	cut.cutAfter = 2
	slow := newFakeVLLM(t)
	slow.gap = time.Second
	hang := newFakeVLLM(t)
	hang.hang = true
	busy := newFakeVLLM(t)
	busy.status, busy.retryAfter = 503, "2"
	killed := newFakeVLLM(t)
	killed.srv.Close()
	big := newFakeVLLM(t)
	big.tokens = 2000

	short := func(c *Config) {
		c.FirstByteTimeout, c.IdleTimeout, c.MaxAttempts = 200*time.Millisecond, 200*time.Millisecond, 1
	}
	tests := []struct {
		name   string
		url    string
		opt    func(*Config)
		body   string
		status int
		words  string
	}{
		{"connection refused", closedPort(t), nil, chatPlain, 503, "refused the connection"},
		{"killed replica", killed.url, nil, chatPlain, 503, "unreachable"},
		{"closed before answering", rawUpstream(t, ""), nil, chatPlain, 502, "closed the connection before answering"},
		{"not HTTP", rawUpstream(t, "hello there\r\n\r\n"), nil, chatPlain, 502, "failed before answering"},
		{"head cut short", rawUpstream(t, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: application/json\r\n\r\n{\"id\":"), nil, chatPlain, 502, "during the response"},
		{"no first byte", hang.url, short, chatPlain, 504, "in time"},
		{"stream cut", cut.url, nil, chatStream, 200, "without [DONE]"},
		{"stream idle", slow.url, short, chatStream, 200, "no stream event"},
		{"response too large", big.url, func(c *Config) { c.MaxResponseBytes = 512 }, chatPlain, 502, "over 512 bytes"},
		{"engine refusal", busy.url, nil, chatPlain, 503, "refused the request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := []routerOpt{}
			if tt.opt != nil {
				opts = append(opts, withConfig(tt.opt))
			}
			tr := startRouter(t, []string{tt.url}, opts...)
			resp := post(t, tr.url+"/v1/chat/completions", tt.body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %.300s", resp.StatusCode, tt.status, b)
			}
			msgs := clientMessages(t, b)
			if len(msgs) == 0 {
				t.Fatalf("no error message in %.300s", b)
			}
			for _, m := range msgs {
				for _, internal := range []string{"fasthttp", "dial tcp", "read tcp", "write tcp", "EOF", "syscall"} {
					if strings.Contains(m, internal) {
						t.Errorf("client reads %q: it names %q", m, internal)
					}
				}
			}
			if !strings.Contains(strings.Join(msgs, " | "), tt.words) {
				t.Errorf("messages %q lack %q", msgs, tt.words)
			}
		})
	}
}
