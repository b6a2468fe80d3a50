package tracing

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TestTraceparentMatchesW3CPropagator: what the router writes by hand,
// without allocating, is byte for byte what the OpenTelemetry W3C
// propagator writes.
func TestTraceparentMatchesW3CPropagator(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ts, err := trace.ParseTraceState("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		var tid trace.TraceID
		var sid trace.SpanID
		for j := range tid {
			tid[j] = byte(rng.Uint32())
		}
		for j := range sid {
			sid[j] = byte(rng.Uint32())
		}
		cfg := trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(rng.Uint32())}
		if i%2 == 0 {
			cfg.TraceState = ts
		}
		sc := trace.NewSpanContext(cfg)
		want := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), want)

		h := &fasthttp.RequestHeader{}
		h.Set("tracestate", "stale") // a client's, forwarded
		var ts []byte
		if sc.TraceState().Len() > 0 {
			ts = []byte(sc.TraceState().String())
		}
		inject(h, appendTraceparent(nil, sc), ts)
		if got := string(h.Peek("traceparent")); got != want["traceparent"] {
			t.Fatalf("traceparent %q, propagator %q", got, want["traceparent"])
		}
		if got := string(h.Peek("tracestate")); got != want["tracestate"] {
			t.Fatalf("tracestate %q, propagator %q", got, want["tracestate"])
		}
		lines := "traceparent: " + want["traceparent"] + "\r\n"
		if want["tracestate"] != "" {
			lines += "tracestate: " + want["tracestate"] + "\r\n"
		}
		if got := string(appendHeaderLines([]byte("X: y\r\n"), sc, ts)); got != "X: y\r\n"+lines {
			t.Fatalf("header lines %q, want %q", got, lines)
		}
	}
}

func TestIsTraceHeader(t *testing.T) {
	for name, want := range map[string]bool{
		"traceparent": true, "Traceparent": true, "TRACESTATE": true, "tracestate": true,
		"traceparents": false, "trace": false, "": false, "x-traceparent": false, "baggage": false,
	} {
		if got := IsTraceHeader([]byte(name)); got != want {
			t.Errorf("IsTraceHeader(%q) = %v", name, got)
		}
	}
}

func TestRemoteSpanContext(t *testing.T) {
	tests := []struct {
		name, tp, ts string
		valid        bool
		sampled      bool
		state        string
	}{
		{"sampled", clientTP, "", true, true, ""},
		{"not sampled", "00-" + clientTrace + "-" + clientSpan + "-00", "", true, false, ""},
		{"with tracestate", clientTP, "a=1,b=2", true, true, "a=1,b=2"},
		{"future version", "cc-" + clientTrace + "-" + clientSpan + "-01-extra", "", true, true, ""},
		{"none", "", "a=1", false, false, ""},
		{"version ff", "ff-" + clientTrace + "-" + clientSpan + "-01", "", false, false, ""},
		{"short", "00-" + clientTrace[:30] + "-" + clientSpan + "-01", "", false, false, ""},
		{"zero span id", "00-" + clientTrace + "-0000000000000000-01", "", false, false, ""},
		{"upper case", "00-" + strings.ToUpper(clientTrace) + "-" + clientSpan + "-01", "", false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := RemoteSpanContext(clientHeader(tt.tp, tt.ts))
			if sc.IsValid() != tt.valid || sc.IsSampled() != tt.sampled || sc.TraceState().String() != tt.state {
				t.Errorf("got valid %v sampled %v state %q", sc.IsValid(), sc.IsSampled(), sc.TraceState())
			}
			if sc.IsValid() && (sc.TraceID().String() != clientTrace || sc.SpanID().String() != clientSpan || !sc.IsRemote()) {
				t.Errorf("got %v", sc)
			}
		})
	}
	if RemoteSpanContext(nil).IsValid() {
		t.Error("nil header: valid")
	}
}

// FuzzRemoteSpanContext: any client's trace headers are read without
// panicking, and what is read is what the router writes back.
func FuzzRemoteSpanContext(f *testing.F) {
	f.Add(clientTP, "vendor=x")
	f.Add("00-"+clientTrace+"-"+clientSpan+"-00", "")
	f.Add("cc-"+clientTrace+"-"+clientSpan+"-03-more", "a=1,b=2")
	f.Add("00-xyz", "=,=")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		h := &fasthttp.RequestHeader{}
		h.Set("traceparent", tp)
		h.Set("tracestate", ts)
		sc := RemoteSpanContext(h)
		if !sc.IsValid() {
			return
		}
		out := &fasthttp.RequestHeader{}
		inject(out, appendTraceparent(nil, sc), []byte(sc.TraceState().String()))
		back := RemoteSpanContext(out)
		if !back.Equal(sc.WithTraceFlags(sc.TraceFlags() & writtenFlags)) {
			t.Fatalf("read %v, wrote %q %q, read back %v", sc, out.Peek("traceparent"), out.Peek("tracestate"), back)
		}
		if tpOut := string(out.Peek("traceparent")); len(tpOut) != traceparentLen {
			t.Fatalf("wrote traceparent %q", tpOut)
		}
	})
}
