package proxy

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/gpurouter/gpurouter/proxy/observe"
	"github.com/gpurouter/gpurouter/tracing"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// memClient is a replica in memory: every request gets the same whole
// answer, without a socket (upstreamClient).
type memClient struct{ body []byte }

func (c memClient) Do(_ *fasthttp.Request, resp *fasthttp.Response) error {
	resp.SetStatusCode(fasthttp.StatusOK)
	resp.Header.SetContentType("application/json")
	resp.SetBodyRaw(c.body)
	return nil
}

// BenchmarkRouterWork is the router's own work for one non-streamed
// request, with the sockets taken away: the handler from the request's
// headers and body to its answer's head and body written to a buffer, and
// the exchange finished (metrics, record, access log). No socket is read
// or written, no goroutine parked or woken, no HTTP parsed off the wire:
// set beside `gpurouter bench proxy-cost`'s CPU per request, it splits
// that figure into what the router's features cost and what serving HTTP
// on Go's netpoller and fasthttp costs. The bodies are the harness's:
// a 300-byte chat request, a 500-byte answer.
func BenchmarkRouterWork(b *testing.B) {
	core := zapcore.NewCore(zapcore.NewJSONEncoder(observe.LogEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel)
	b.Run("log=off", func(b *testing.B) { benchRouterWork(b, nil, nil, nil) })
	b.Run("log=zap", func(b *testing.B) { benchRouterWork(b, zap.New(core), nil, nil) })
	// As `gpurouter serve` logs: the common line written by the proxy.
	b.Run("log=serve", func(b *testing.B) { benchRouterWork(b, zap.New(core), io.Discard, nil) })
	// Tracing (trace.go), logs off: a Tracer that is off, which must cost
	// what none does (log=off: the same allocs/op, 0 more); every request
	// sampled out (only its trace context for the engine); every request
	// recorded, its spans exported to nowhere.
	zero := 0.0
	for _, tc := range []struct {
		name string
		cfg  *tracing.Config // nil: a Tracer that is off
	}{{"tracing=off", nil}, {"tracing=sampled_out", &tracing.Config{SamplingRatio: &zero}}, {"tracing=on", &tracing.Config{}}} {
		b.Run(tc.name, func(b *testing.B) {
			var o tracing.Options
			cfg := tracing.Config{}
			if tc.cfg != nil {
				cfg, o.Exporter = *tc.cfg, tracetest.NewNoopExporter()
			}
			tracer, err := tracing.New(context.Background(), cfg, o)
			if err != nil {
				b.Fatal(err)
			}
			defer tracer.Shutdown(context.Background()) //nolint:errcheck
			benchRouterWork(b, nil, nil, tracer)
		})
	}
}

func benchRouterWork(b *testing.B, log *zap.Logger, access io.Writer, tracer *tracing.Tracer) {
	tr := startRouterWith(b, []string{"http://127.0.0.1:9"}, func(o *Options) { o.Logger, o.AccessLog, o.Tracer = log, access, tracer },
		withPolicy("least_request"))
	for _, u := range tr.srv.routes.Load().upstreams {
		u.client = memClient{body: harnessReply}
	}
	body := []byte(harnessRequest)
	if len(body) != 300 || len(harnessReply) != 500 {
		b.Fatalf("request %d B, reply %d B: not the harness's 300 and 500", len(body), len(harnessReply))
	}
	var ctx fasthttp.RequestCtx
	bw := bufio.NewWriter(io.Discard)
	b.ReportAllocs()
	for b.Loop() {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod(fasthttp.MethodPost)
		ctx.Request.SetRequestURI("/v1/chat/completions")
		ctx.Request.Header.SetContentType("application/json")
		ctx.Request.SetBodyRaw(body)
		tr.srv.handle(&ctx)
		if ctx.Response.StatusCode() != fasthttp.StatusOK {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		// The head and body, as fasthttp's server writes them; closing the
		// body finishes the exchange.
		if err := ctx.Response.Write(bw); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if n := tr.srv.Active(); n != 0 {
		b.Fatalf("%d exchanges not finished", n)
	}
}

// harnessRequest and harnessReply are `gpurouter bench proxy-cost`'s
// default bodies (bench/proxycost: chatRequest(300, false), chatReply(500)).
var (
	harnessRequest = `{"model":"m","messages":[{"role":"user","content":"` + padWords(300-87) + `"}],"max_tokens":64,"temperature":0}`
	harnessReply   = []byte(`{"id":"chatcmpl-proxycost","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		padWords(500-150-115) + `"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":60,"total_tokens":124,"completion_tokens":64}}`)
)

func padWords(n int) string {
	return strings.Repeat("lorem ipsum dolor sit amet consectetur adipiscing elit ", n/55+1)[:n]
}
