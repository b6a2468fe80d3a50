package proxy

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// trivialUpstream answers every POST with a small OpenAI JSON body, or a
// fixed SSE stream of n events, with no per-request allocation of its own,
// so the benchmarks below measure the router.
func trivialUpstream(b *testing.B, events int) string {
	b.Helper()
	plain := []byte(`{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1}}`)
	var sse bytes.Buffer
	for i := 0; i < events; i++ {
		sse.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok "}}]}` + "\n\n")
	}
	sse.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":5,"completion_tokens":0}}` + "\n\ndata: [DONE]\n\n")
	stream := sse.Bytes()
	return serveBench(b, func(ctx *fasthttp.RequestCtx) {
		if bytes.Contains(ctx.PostBody(), []byte(`"stream":true`)) {
			ctx.SetContentType("text/event-stream")
			ctx.SetBody(stream)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(plain)
	})
}

// serveBench serves h on a loopback port until the benchmark ends and
// returns its URL.
func serveBench(b *testing.B, h fasthttp.RequestHandler) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h}
	go srv.Serve(ln) //nolint:errcheck
	b.Cleanup(func() { srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func benchRouter(b *testing.B, upstream string) *fasthttp.HostClient {
	return benchRouterWith(b, upstream, nil)
}

// benchRouterWith is benchRouter with edit applied to the router's
// Options (nil: none).
func benchRouterWith(b *testing.B, upstream string, edit func(*Options)) *fasthttp.HostClient {
	b.Helper()
	tr := startRouterWith(b, []string{upstream}, edit, withPolicy("least_request"))
	b.Cleanup(func() { tr.srv.Shutdown(b.Context()) }) //nolint:errcheck
	return &fasthttp.HostClient{Addr: strings.TrimPrefix(tr.url, "http://"), MaxConns: 64}
}

// BenchmarkProxyNonStream is the hot path for a small non-streamed request:
// parse, pick, forward over loopback, read the reply, answer. Allocations
// include the benchmark's client and upstream (both zero-alloc fasthttp).
func BenchmarkProxyNonStream(b *testing.B) {
	benchNonStream(b, benchRouter(b, trivialUpstream(b, 0)))
}

// BenchmarkProxyNonStreamLogged is BenchmarkProxyNonStream with the
// access log on, JSON as `gpurouter serve` writes it (to io.Discard): the
// line's encoding and allocations (one pooled set of fields, not a 1 KiB
// slice a request) on top.
func BenchmarkProxyNonStreamLogged(b *testing.B) {
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel)
	benchNonStream(b, benchRouterWith(b, trivialUpstream(b, 0), func(o *Options) { o.Logger = zap.New(core) }))
}

func benchNonStream(b *testing.B, c *fasthttp.HostClient) {
	body := []byte(chatPlain)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		for pb.Next() {
			req.Reset()
			req.Header.SetMethod("POST")
			req.SetRequestURI("/v1/chat/completions")
			req.Header.SetHost("router")
			req.SetBody(body)
			if err := c.DoTimeout(req, resp, 5*time.Second); err != nil || resp.StatusCode() != 200 {
				b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
			}
		}
	})
}

// BenchmarkProxyStreamPerEvent streams 256-event responses through the
// router; ns/op and allocs/op are per relayed event.
func BenchmarkProxyStreamPerEvent(b *testing.B) {
	const events = 256
	benchStream(b, benchRouter(b, trivialUpstream(b, events)), events, nil)
}

// benchStream sends streamed chat requests through c until b.N events
// have been relayed (events per response), checking each response ends
// with [DONE] and, if check is set, what else it must hold.
func benchStream(b *testing.B, c *fasthttp.HostClient, events int, check func(body []byte)) {
	body := []byte(chatStream)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	b.ReportAllocs()
	for i := 0; i < b.N; i += events {
		req.Reset()
		req.Header.SetMethod("POST")
		req.SetRequestURI("/v1/chat/completions")
		req.Header.SetHost("router")
		req.SetBody(body)
		if err := c.DoTimeout(req, resp, 5*time.Second); err != nil || !bytes.HasSuffix(resp.Body(), []byte(doneEvent)) {
			b.Fatalf("%v %q", err, resp.Body())
		}
		if check != nil {
			check(resp.Body())
		}
	}
}

// BenchmarkRelayProcess is the relay alone (no network): split, classify,
// time and copy SSE events; ns/op and allocs/op are per event.
func BenchmarkRelayProcess(b *testing.B) {
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok "}}]}` + "\n\n")
	const perRead = 4
	chunk := bytes.Repeat(ev, perRead)
	s := &Server{cfg: Config{}.withDefaults(), now: time.Now}
	x := &exchange{s: s, received: time.Now()}
	buf := make([]byte, 0, 16<<10)
	r := &relay{x: x, body: &loopBody{chunk: chunk}, buf: buf, in: buf[:0]}
	p := make([]byte, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for i := 0; i < b.N; i += perRead {
		if _, err := r.Read(p); err != nil {
			b.Fatal(err)
		}
	}
}

// loopBody returns the same chunk forever; a short read goes on where the
// last one stopped (the relay reads an event's first byte on its own).
type loopBody struct {
	chunk []byte
	off   int
}

func (l *loopBody) Read(p []byte) (int, error) {
	n := copy(p, l.chunk[l.off:])
	l.off = (l.off + n) % len(l.chunk)
	return n, nil
}
func (l *loopBody) CloseWithError(error) error { return nil }

func BenchmarkParseRequest(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"max_tokens":128,"user":"u1","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"` + strings.Repeat("word ", 200) + `"}]}`)
	var p fastjson.Parser // the server's come from a pool, reused
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := openai.ReadRequest(&p, body, openai.Chat); err != nil {
			b.Fatal(err)
		}
	}
}
