package bench

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// sseScript is how the fake upstream answers one request.
type sseScript struct {
	status     int           // 0 means 200
	firstDelay time.Duration // before the first chunk
	tokens     int           // chunks with output
	gap        time.Duration // between output chunks
	noDone     bool          // end without data: [DONE]
	noUsage    bool          // no usage chunk
	errorAfter int           // > 0: send an in-stream error after this many tokens
	hold       <-chan struct{}
	batch      int  // > 1: write this many events per Read (benchmarks)
	noLog      bool // don't record send times (benchmarks)
}

// upstreamLog is what the fake upstream saw and did for one request.
type upstreamLog struct {
	id    string
	path  string
	body  string
	recv  time.Time
	sends []time.Time // when each output chunk was handed to the server
}

// fakeUpstream is a loopback fasthttp server speaking vLLM's SSE dialect.
type fakeUpstream struct {
	url    string
	script func(id string) sseScript

	mu   sync.Mutex
	logs map[string]*upstreamLog
}

func startUpstream(t testing.TB, script func(id string) sseScript) *fakeUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &fakeUpstream{url: "http://" + ln.Addr().String(), script: script, logs: map[string]*upstreamLog{}}
	srv := &fasthttp.Server{Handler: u.handle, Concurrency: 100000, ReadBufferSize: 1 << 16, Logger: quietLogger{}}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Shutdown(); <-done })
	return u
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

func (u *fakeUpstream) log(id string) *upstreamLog {
	u.mu.Lock()
	defer u.mu.Unlock()
	l := u.logs[id]
	if l == nil {
		return nil
	}
	c := *l
	c.sends = append([]time.Time(nil), l.sends...)
	return &c
}

func (u *fakeUpstream) handle(ctx *fasthttp.RequestCtx) {
	id := string(ctx.Request.Header.Peek("X-Request-Id"))
	l := &upstreamLog{id: id, path: string(ctx.Path()), body: string(ctx.PostBody()), recv: time.Now()}
	u.mu.Lock()
	u.logs[id] = l
	u.mu.Unlock()
	s := u.script(id)
	if s.status != 0 && s.status != fasthttp.StatusOK {
		ctx.SetStatusCode(s.status)
		ctx.SetContentType("application/json")
		fmt.Fprintf(ctx, `{"error":{"message":"scripted %d","type":"X","param":null,"code":%d}}`, s.status, s.status)
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.Response.ImmediateHeaderFlush = true
	ctx.SetBodyStream(&sseBody{u: u, log: l, s: s, chat: strings.HasSuffix(l.path, "/chat/completions")}, -1)
}

// sseBody produces the scripted stream one event per Read, so the server
// flushes each event separately and no goroutine is needed per stream.
type sseBody struct {
	u    *fakeUpstream
	log  *upstreamLog
	s    sseScript
	chat bool
	step int // 0: role chunk (chat) / nothing; 1..tokens: output; then usage, done
	sent int
	buf  []byte // pending bytes: store[off:]
	off  int
	end  bool
}

func (b *sseBody) Read(p []byte) (int, error) {
	if b.off == len(b.buf) {
		if b.end {
			return 0, io.EOF
		}
		b.buf, b.off = b.buf[:0], 0
		n := max(b.s.batch, 1)
		for i := 0; i < n && !b.end; i++ {
			b.next()
		}
	}
	k := copy(p, b.buf[b.off:])
	b.off += k
	return k, nil
}

func (b *sseBody) next() {
	s := b.s
	switch {
	case b.step == 0:
		if s.firstDelay > 0 {
			time.Sleep(s.firstDelay)
		}
		if b.chat {
			b.buf = append(b.buf, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		}
		b.step++
	case b.step <= s.tokens:
		if b.step > 1 && s.gap > 0 {
			time.Sleep(s.gap)
		}
		if b.step == 2 && s.hold != nil {
			<-s.hold
		}
		if s.errorAfter > 0 && b.sent == s.errorAfter {
			b.buf = append(b.buf, `data: {"error":{"message":"engine died","type":"InternalServerError","param":null,"code":500}}`+"\n\ndata: [DONE]\n\n"...)
			b.end = true
			return
		}
		if b.chat {
			b.buf = append(b.buf, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		} else {
			b.buf = append(b.buf, `data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		}
		b.sent++
		if !s.noLog {
			now := time.Now()
			b.u.mu.Lock()
			b.log.sends = append(b.log.sends, now)
			b.u.mu.Unlock()
		}
		b.step++
	default:
		if !s.noUsage {
			b.buf = append(b.buf, fmt.Sprintf(`data: {"id":"x","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":7,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n", 7+b.sent, b.sent)...)
		}
		if !s.noDone {
			b.buf = append(b.buf, "data: [DONE]\n\n"...)
		}
		b.end = true
	}
}
