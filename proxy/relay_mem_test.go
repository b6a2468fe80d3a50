package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// gatedBody hands out one queued read at a time and blocks in between,
// telling the test (waiting) each time a read is about to block — as an
// upstream stream does between two events.
type gatedBody struct {
	next    chan []byte
	waiting chan struct{}
	pending []byte
}

func (g *gatedBody) Read(p []byte) (int, error) {
	if len(g.pending) == 0 {
		g.waiting <- struct{}{}
		b, ok := <-g.next
		if !ok {
			return 0, io.EOF
		}
		g.pending = b
	}
	n := copy(p, g.pending)
	g.pending = g.pending[n:]
	return n, nil
}

func (g *gatedBody) CloseWithError(error) error { return nil }

// A stream waiting for its next event holds no relay buffer: the relay
// waits for the event's first byte without one and takes a pooled one for
// the rest, so 1,000 idle streams hold 1,000 fewer. Events split anywhere
// still arrive whole and in order.
func TestRelayHoldsNoBufferWhileWaiting(t *testing.T) {
	ev := func(s string) []byte { return []byte(`data: {"choices":[{"delta":{"content":"` + s + `"}}]}` + "\n\n") }
	e1, e2 := ev("one"), ev("two")
	s := &Server{cfg: Config{}.withDefaults(), now: time.Now}
	x := &exchange{s: s, received: time.Now()}
	g := &gatedBody{next: make(chan []byte), waiting: make(chan struct{})}
	r := &relay{x: x, body: g}
	var got bytes.Buffer
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(&got, r)
		done <- err
	}()
	feeds := [][]byte{e1, e2[:7], e2[7:], []byte("data: [DONE]\n\n")}
	for i, f := range feeds {
		select {
		case <-g.waiting:
		case <-time.After(5 * time.Second):
			t.Fatalf("relay never read feed %d", i)
		}
		// Blocked before an event (not mid-event): no buffer held.
		if i != 2 && (r.buf != nil || r.out != nil) {
			t.Fatalf("feed %d: relay holds %d+%d bytes of buffers while it waits between events", i, cap(r.buf), cap(r.out))
		}
		if i == 2 && r.buf == nil {
			t.Fatal("relay let go of the buffer holding half an event")
		}
		g.next <- f
	}
	select {
	case <-g.waiting:
		close(g.next)
	case <-time.After(5 * time.Second):
		t.Fatal("relay never read past [DONE]")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("relay did not end")
	}
	want := string(e1) + string(e2) + "data: [DONE]\n\n"
	if got.String() != want {
		t.Fatalf("relayed %q, want %q", got.String(), want)
	}
	if x.tokenChunks != 2 {
		t.Fatalf("token chunks %d, want 2", x.tokenChunks)
	}
}

// An upstream's response head must fit the connection's read buffer
// (Config.MaxUpstreamHeader); a bigger one is a bad upstream, answered 502
// with the OpenAI error body, not a hang or a truncated reply.
func TestUpstreamHeadOverReadBufferIs502(t *testing.T) {
	big := strings.Repeat("x", DefaultMaxUpstreamHeader)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		if r.Header.Get("X-Big") != "" {
			w.Header().Set("X-Big", big)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`) //nolint:errcheck
	}))
	defer up.Close()
	tr := startRouter(t, []string{up.URL})
	small := post(t, tr.url+"/v1/chat/completions", chatPlain)
	small.Body.Close()
	if small.StatusCode != 200 {
		t.Fatalf("small head: status %d, want 200", small.StatusCode)
	}
	resp := post(t, tr.url+"/v1/chat/completions", chatPlain, "X-Big", "1")
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), `"error"`) {
		t.Fatalf("head over %d bytes: status %d %s, want 502 with an error body", DefaultMaxUpstreamHeader, resp.StatusCode, b)
	}
	// Config.MaxUpstreamHeader raises the bound.
	roomy := startRouter(t, []string{up.URL}, withConfig(func(c *Config) { c.MaxUpstreamHeader = 4 * DefaultMaxUpstreamHeader }))
	ok := post(t, roomy.url+"/v1/chat/completions", chatPlain, "X-Big", "1")
	ok.Body.Close()
	if ok.StatusCode != 200 {
		t.Fatalf("head under MaxUpstreamHeader: status %d, want 200", ok.StatusCode)
	}
}

// Once a stream has started, the client's request body is given back —
// unless the migration resends that very body (it asked for no token ids
// and nothing rewrote it).
func TestStreamReleasesClientBody(t *testing.T) {
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name string
		mig  func(client []byte) *migration
		kept bool
	}{
		{"no migration", func([]byte) *migration { return nil }, false},
		{"migration with its own copy", func(c []byte) *migration { return &migration{body: append([]byte(nil), c...)} }, false},
		{"migration resending the client's body", func(c []byte) *migration { return &migration{body: c} }, true},
		{"migration resending a prefix of it", func(c []byte) *migration { return &migration{body: c[:10]} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ctx fasthttp.RequestCtx
			ctx.Request.SetBodyString(body)
			x := &exchange{mig: tc.mig(ctx.PostBody())}
			releaseClientBody(&ctx, x)
			if got := string(ctx.PostBody()); (got == body) != tc.kept {
				t.Fatalf("body after release: %q (kept %v, want kept %v)", got, got == body, tc.kept)
			}
		})
	}
}

// BenchmarkRelayEventPerRead is the relay when each read brings one event,
// as a stream's events arrive: the buffers go back to relayBufs before
// every wait and come back after it. ns/op and allocs/op are per event.
func BenchmarkRelayEventPerRead(b *testing.B) {
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok "}}]}` + "\n\n")
	s := &Server{cfg: Config{}.withDefaults(), now: time.Now}
	x := &exchange{s: s, received: time.Now()}
	r := &relay{x: x, body: &loopBody{chunk: ev}}
	p := make([]byte, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		if n, err := r.Read(p); err != nil || n != len(ev) {
			b.Fatal(n, err)
		}
	}
}
