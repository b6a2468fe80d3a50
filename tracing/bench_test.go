package tracing

import (
	"context"
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// BenchmarkRequest is one whole request's tracing calls (exampleRequest:
// a wait, three picks and attempts, a relay, a hop, each attempt's
// context injected into the engine request) off, sampled out, and
// recorded (into an exporter that discards).
func BenchmarkRequest(b *testing.B) {
	zero := 0.0
	for _, bc := range []struct {
		name string
		cfg  *Config // nil: tracing off
	}{
		{"off", nil},
		{"sampled_out", &Config{SamplingRatio: &zero}},
		{"recorded", &Config{}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var tr *Tracer
			if bc.cfg != nil {
				var err error
				tr, err = New(context.Background(), *bc.cfg, Options{Exporter: tracetest.NewNoopExporter()})
				if err != nil {
					b.Fatal(err)
				}
				defer tr.Shutdown(context.Background()) //nolint:errcheck
			}
			client, up := clientHeader("", ""), &fasthttp.RequestHeader{}
			b.ReportAllocs()
			for b.Loop() {
				exampleRequest(tr, client, up)
			}
		})
	}
}

// BenchmarkInject is writing one attempt's trace context into an engine
// request, as a fasthttp header and as header lines.
func BenchmarkInject(b *testing.B) {
	tr, err := New(context.Background(), Config{}, Options{Exporter: tracetest.NewNoopExporter()})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Shutdown(context.Background()) //nolint:errcheck
	r := tr.StartRequest(clientHeader(clientTP, "vendor=x"), RequestInfo{}, t0)
	r.AttemptStart(t0, Attempt{Replica: "r1"})
	b.Run("header", func(b *testing.B) {
		up := &fasthttp.RequestHeader{}
		b.ReportAllocs()
		for b.Loop() {
			r.Inject(up)
		}
	})
	b.Run("lines", func(b *testing.B) {
		buf := make([]byte, 0, 256)
		b.ReportAllocs()
		for b.Loop() {
			buf = r.AppendHeaderLines(buf[:0])
		}
	})
}
