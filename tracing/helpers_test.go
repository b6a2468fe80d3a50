package tracing

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// t0 is the example request's arrival; its steps follow at fixed offsets.
var t0 = time.Unix(1_700_000_000, 0)

func at(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }

// finishReasons is a variable, not a literal at the call, so that the
// off path's allocation count is the package's, not the test's.
var finishReasons = []string{"length"}

// exampleInfo is the request of exampleRequest.
var exampleInfo = RequestInfo{
	ID: "req-1", Method: "POST", Path: "/v1/chat/completions", Model: "llama-alias", Pool: "llama",
	Provider: "vllm", Stream: true, MaxTokens: 64, EstimatedInputTokens: 100, Priority: 1, Tenant: "team-a",
}

// exampleRequest drives one request through every step, as the request
// path will: it waits in the queue, its first attempt (r1) cannot
// connect, the second (r2) streams until its replica dies, and the stream
// moves to r3, which finishes it. Each attempt's trace context is
// injected into upstream (the engine request's headers).
func exampleRequest(tr *Tracer, client HeaderGetter, upstream HeaderSetter) *Request {
	r := tr.StartRequest(client, exampleInfo, at(0))
	r.QueueStart(at(1), Queued{Position: 2, Length: 3, Reason: "saturated", CostTokens: 164})
	r.QueueEnd(at(5), "admitted")

	r.Picked(at(5), at(5.01), Pick{Policy: "predictive", Replica: "r1", Candidates: 3, CachedTokens: 32,
		PredictedTTFT: 40 * time.Millisecond, PredictedTPOT: 10 * time.Millisecond, Reason: "least_ttft"})
	r.AttemptStart(at(6), Attempt{Replica: "r1", Address: "127.0.0.1:9001"})
	r.Inject(upstream)
	r.AttemptEnd(at(7), AttemptResult{ErrorType: "connect", RetryReason: "connect_error"})

	r.Picked(at(7), at(7.01), Pick{Policy: "predictive", Replica: "r2", Candidates: 2})
	r.AttemptStart(at(8), Attempt{Replica: "r2", Address: "127.0.0.1:9002"})
	r.Inject(upstream)
	r.AttemptConnected(at(8.5))
	r.AttemptFirstByte(at(20), 200)
	r.RelayStart(at(20))
	r.FirstToken(at(40))
	r.AttemptEnd(at(60), AttemptResult{Status: 200, ErrorType: "reset"})

	r.MigrationStart(at(60), Migration{Hop: 1, From: "r2", Reason: "reset", RelayedTokens: 5})
	r.Picked(at(60), at(60.01), Pick{Policy: "predictive", Replica: "r3", Candidates: 1})
	r.AttemptStart(at(61), Attempt{Replica: "r3", Address: "[::1]:9003"})
	r.Inject(upstream)
	r.AttemptConnected(at(61))
	r.AttemptFirstByte(at(70), 200)
	r.MigrationEnd(at(70), "r3", "")

	r.RelayEnd(at(100), Relay{TTFT: 40 * time.Millisecond, TPOT: 10 * time.Millisecond, Chunks: 10, OutputTokens: 10,
		ITLCount: 9, ITLMean: 6 * time.Millisecond, ITLMax: 20 * time.Millisecond})
	r.End(at(100), Result{Status: 200, Outcome: "ok", Usage: Usage{InputTokens: 100, OutputTokens: 10,
		CachedInputTokens: 32, ResponseID: "chatcmpl-1", ResponseModel: "llama", FinishReasons: finishReasons}})
	return r
}

// exampleSpans is how many spans exampleRequest records: the request,
// the wait, three picks, three attempts, the relay and the hop.
const exampleSpans = 10

// newMemTracer is a Tracer exporting to memory, with cfg's sampling.
func newMemTracer(t testing.TB, cfg Config) (*Tracer, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tr, err := New(context.Background(), cfg, Options{Exporter: exp, ServiceVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return tr, exp
}

// flushed is what exp holds once tr has exported everything ended.
func flushed(t testing.TB, tr *Tracer, exp *tracetest.InMemoryExporter) tracetest.SpanStubs {
	t.Helper()
	if err := tr.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	return exp.GetSpans()
}

// byName indexes spans by name; a name that repeats keeps every span in
// order of start.
func byName(spans tracetest.SpanStubs) map[string][]tracetest.SpanStub {
	m := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		m[s.Name] = append(m[s.Name], s)
	}
	for _, l := range m {
		for i := 1; i < len(l); i++ {
			for j := i; j > 0 && l[j].StartTime.Before(l[j-1].StartTime); j-- {
				l[j], l[j-1] = l[j-1], l[j]
			}
		}
	}
	return m
}

// attrs is s's attributes by key, as their Go values.
func attrs(s tracetest.SpanStub) map[string]any {
	m := map[string]any{}
	for _, kv := range s.Attributes {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// fixedIDs makes ids from counters: deterministic traces for tests.
type fixedIDs struct{ n uint64 }

func (g *fixedIDs) next() uint64 { g.n++; return g.n }

func (g *fixedIDs) NewIDs(context.Context) (trace.TraceID, trace.SpanID) {
	var tid trace.TraceID
	tid[0], tid[15] = 0xab, byte(g.next())
	return tid, g.NewSpanID(context.Background(), tid)
}

func (g *fixedIDs) NewSpanID(context.Context, trace.TraceID) trace.SpanID {
	var sid trace.SpanID
	sid[0], sid[7] = 0xcd, byte(g.next())
	return sid
}

var _ sdktrace.IDGenerator = (*fixedIDs)(nil)
