package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeVLLM is a hand-written OpenAI-compatible upstream on a loopback port,
// built on net/http so that it notices a vanished router the way uvicorn
// does (its request context is canceled). Each test scripts it through the
// fields below, set before the first request.
type fakeVLLM struct {
	t   *testing.T
	url string
	srv *http.Server

	// Behaviour.
	status     int    // non-zero: answer every request with this status and an error body
	retryAfter string // with status: the Retry-After header to send
	// lowerHeaders writes header names in lower case, as uvicorn (vLLM's
	// server) does: HTTP/1.1 names are case-insensitive.
	lowerHeaders bool
	// closeAfter closes every connection right after its response while
	// advertising keep-alive (Keep-Alive: timeout=5, max=100, no
	// Connection: close), as llama.cpp's llama-server does.
	closeAfter atomic.Bool
	// closeDelay: closeAfter waits this long first, the connection's
	// goroutine blocked meanwhile, so a client that reuses the connection
	// at once writes a request the engine never reads. Which comes first,
	// the engine's FIN or the client's next request, is otherwise a race
	// a fast client wins only now and then.
	closeDelay time.Duration
	tokens     int // tokens per response [5]
	// promptTokens is the prompt_tokens its usage reports [7]; -1 reports
	// 0, as an engine that counts none: nothing for the router to learn
	// its prompt estimate from.
	promptTokens int
	prefill      time.Duration // wait before the first token (honours cancellation)
	gap          time.Duration // wait between tokens
	// roleLead: a stream's first chunk carries no output (chat: the role
	// alone, as vLLM sends it; completions: empty text), this long before
	// the first token.
	roleLead   time.Duration
	cutAfter   int      // >0: close the stream after this many tokens, without [DONE]
	hang       bool     // never answer (until the client goes away)
	garbage    bool     // non-streamed 200 with a body that is not JSON
	lockstep   chan int // if set: after sending token i, wait for the test to send i back
	sendTimeMu sync.Mutex
	sendTimes  []time.Time // when each token event was written and flushed

	// Observations.
	requests atomic.Int64
	canceled atomic.Int64
	apiConns sync.Map           // the connections API requests came on, by remote address
	received chan *http.Request // request heads, if the test wants them (buffered)
	bodies   chan []byte
	headers  chan http.Header
}

// setHeader sets a response header, its name in lower case with
// lowerHeaders (net/http writes a name as the map holds it).
func (f *fakeVLLM) setHeader(w http.ResponseWriter, k, v string) {
	if f.lowerHeaders {
		w.Header()[strings.ToLower(k)] = []string{v}
		return
	}
	w.Header().Set(k, v)
}

func newFakeVLLM(t *testing.T) *fakeVLLM {
	t.Helper()
	f := &fakeVLLM{t: t, tokens: 5, received: make(chan *http.Request, 64), bodies: make(chan []byte, 64), headers: make(chan http.Header, 64)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.url = "http://" + ln.Addr().String()
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve), ConnState: func(c net.Conn, st http.ConnState) {
		// StateIdle: the response is complete and the server would wait
		// for the next request on this connection.
		if st == http.StateIdle && f.closeAfter.Load() {
			time.Sleep(f.closeDelay)
			c.Close()
		}
	}}
	go f.srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { f.srv.Close() })
	return f
}

func (f *fakeVLLM) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		return
	case "/v1/chat/completions", "/v1/completions", "/v1/embeddings":
	default:
		http.NotFound(w, r)
		return
	}
	f.requests.Add(1)
	f.apiConns.Store(r.RemoteAddr, true)
	body, _ := io.ReadAll(r.Body)
	select {
	case f.bodies <- body:
	default:
	}
	select {
	case f.headers <- r.Header.Clone():
	default:
	}
	select {
	case f.received <- r:
	default:
	}
	if f.closeAfter.Load() {
		f.setHeader(w, "Keep-Alive", "timeout=5, max=100")
	}
	if f.status != 0 {
		if f.retryAfter != "" {
			f.setHeader(w, "Retry-After", f.retryAfter)
		}
		f.setHeader(w, "Content-Type", "application/json")
		w.WriteHeader(f.status)
		fmt.Fprintf(w, `{"error":{"message":"fake status %d","type":"ServiceUnavailableError","param":null,"code":%d}}`, f.status, f.status)
		return
	}
	if f.hang {
		<-r.Context().Done()
		f.canceled.Add(1)
		return
	}
	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":{"message":"bad json","type":"BadRequestError","param":null,"code":400}}`, 400)
		return
	}
	chat := r.URL.Path == "/v1/chat/completions"
	if !req.Stream {
		if !f.wait(r, f.prefill) {
			return
		}
		f.setHeader(w, "Content-Type", "application/json")
		if f.garbage {
			io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"trunc`)
			return
		}
		text := strings.Repeat("tok ", f.tokens)
		if chat {
			fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"length"}],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}`, req.Model, text, f.usagePrompt(), f.usagePrompt()+f.tokens, f.tokens)
		} else {
			fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":%q,"finish_reason":"length"}],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}`, req.Model, text, f.usagePrompt(), f.usagePrompt()+f.tokens, f.tokens)
		}
		return
	}
	// Like uvicorn, send the headers at once; the first token follows prefill.
	f.setHeader(w, "Content-Type", "text/event-stream")
	w.WriteHeader(200)
	fl := w.(http.Flusher)
	fl.Flush()
	if !f.wait(r, f.prefill) {
		return
	}
	if chat {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", req.Model)
	} else if f.roleLead > 0 {
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\n", req.Model)
	}
	if f.roleLead > 0 {
		fl.Flush()
		if !f.wait(r, f.roleLead) {
			return
		}
	}
	for i := 0; i < f.tokens; i++ {
		if f.cutAfter > 0 && i == f.cutAfter {
			// Die like a crashed engine: no [DONE], no final chunk, the
			// connection dropped (net/http's documented way to abort).
			fl.Flush()
			panic(http.ErrAbortHandler)
		}
		var err error
		if chat {
			_, err = fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", req.Model, i)
		} else {
			_, err = fmt.Fprintf(w, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"text\":\"tok%d \"}]}\n\n", req.Model, i)
		}
		fl.Flush()
		f.sendTimeMu.Lock()
		f.sendTimes = append(f.sendTimes, time.Now())
		f.sendTimeMu.Unlock()
		if err != nil || r.Context().Err() != nil {
			f.canceled.Add(1)
			return
		}
		if f.lockstep != nil {
			select {
			case <-f.lockstep:
			case <-r.Context().Done():
				f.canceled.Add(1)
				return
			case <-time.After(10 * time.Second):
				f.t.Errorf("fake: no ack for token %d within 10s: the router is buffering", i)
				return
			}
		}
		if i < f.tokens-1 && !f.wait(r, f.gap) {
			return
		}
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d,\"completion_tokens\":%d}}\n\n", req.Model, f.usagePrompt(), f.usagePrompt()+f.tokens, f.tokens)
	}
	io.WriteString(w, "data: [DONE]\n\n")
	fl.Flush()
}

// wait sleeps d unless the request is canceled first (then it counts the
// cancellation and returns false).
func (f *fakeVLLM) wait(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return r.Context().Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		f.canceled.Add(1)
		return false
	}
}

// usagePrompt is the prompt_tokens f's usage reports (promptTokens).
func (f *fakeVLLM) usagePrompt() int {
	switch {
	case f.promptTokens < 0:
		return 0
	case f.promptTokens == 0:
		return 7
	}
	return f.promptTokens
}
