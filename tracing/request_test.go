package tracing

import (
	"context"
	"reflect"
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// clientHeader is a client's request head carrying traceparent tp (none
// when "") and tracestate ts.
func clientHeader(tp, ts string) *fasthttp.RequestHeader {
	h := &fasthttp.RequestHeader{}
	h.SetMethod("POST")
	h.SetRequestURI("/v1/chat/completions")
	if tp != "" {
		h.Set("Traceparent", tp)
	}
	if ts != "" {
		h.Set("Tracestate", ts)
	}
	return h
}

const (
	clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan  = "00f067aa0ba902b7"
	clientTP    = "00-" + clientTrace + "-" + clientSpan + "-01"
)

// TestRequestSpanTree: every step of a request is a span under the
// request's, which continues the client's trace; names, kinds, times and
// attributes follow the conventions the package documents.
func TestRequestSpanTree(t *testing.T) {
	tr, exp := newMemTracer(t, Config{})
	up := &fasthttp.RequestHeader{}
	r := exampleRequest(tr, clientHeader(clientTP, "vendor=x"), up)
	spans := flushed(t, tr, exp)
	if len(spans) != exampleSpans {
		t.Fatalf("%d spans, want %d:\n%v", len(spans), exampleSpans, names(spans))
	}
	m := byName(spans)
	req := one(t, m, "POST /v1/chat/completions")
	if got := req.SpanContext.TraceID().String(); got != clientTrace {
		t.Errorf("trace id %s, want the client's %s", got, clientTrace)
	}
	if got := req.Parent.SpanID().String(); got != clientSpan || !req.Parent.IsRemote() {
		t.Errorf("request parent %s (remote %v), want the client's span %s", got, req.Parent.IsRemote(), clientSpan)
	}
	if req.SpanKind != trace.SpanKindServer || !req.StartTime.Equal(at(0)) || !req.EndTime.Equal(at(100)) {
		t.Errorf("request kind %v, %v–%v", req.SpanKind, req.StartTime, req.EndTime)
	}
	if !r.SpanContext().Equal(req.SpanContext) {
		t.Errorf("Request.SpanContext %v, exported %v", r.SpanContext(), req.SpanContext)
	}
	wantAttrs(t, req, map[string]any{
		"http.request.method": "POST", "url.path": "/v1/chat/completions", "gen_ai.operation.name": "chat",
		"gen_ai.provider.name": "vllm", "gen_ai.request.model": "llama-alias", "gen_ai.request.max_tokens": int64(64),
		"gpurouter.request.id": "req-1", "gpurouter.pool": "llama", "gpurouter.request.stream": true,
		"gpurouter.request.priority": int64(1), "gpurouter.request.estimated_input_tokens": int64(100),
		"gpurouter.request.tenant": "team-a", "http.response.status_code": int64(200), "gpurouter.outcome": "ok",
		"gpurouter.attempts": int64(3), "gen_ai.usage.input_tokens": int64(100), "gen_ai.usage.output_tokens": int64(10),
		"gen_ai.usage.cache_read.input_tokens": int64(32), "gen_ai.response.id": "chatcmpl-1",
		"gen_ai.response.model": "llama", "gen_ai.response.finish_reasons": []string{"length"},
	})
	if req.Status.Code != codes.Unset {
		t.Errorf("request status %v", req.Status)
	}
	if got := req.Resource.Set(); !got.HasValue("service.name") || !got.HasValue("service.version") {
		t.Errorf("resource %v lacks service.name/version", req.Resource)
	}
	for _, s := range spans {
		if s.SpanContext.TraceID() != req.SpanContext.TraceID() {
			t.Errorf("%s in trace %s", s.Name, s.SpanContext.TraceID())
		}
		if s.Name != req.Name && s.Parent.SpanID() != req.SpanContext.SpanID() {
			t.Errorf("%s's parent is %s, want the request span", s.Name, s.Parent.SpanID())
		}
		if s.SpanContext.TraceState().String() != "vendor=x" {
			t.Errorf("%s trace state %q, want the client's", s.Name, s.SpanContext.TraceState())
		}
	}

	q := one(t, m, SpanAdmission)
	wantAttrs(t, q, map[string]any{"gpurouter.admission.queue_position": int64(2), "gpurouter.admission.queue_length": int64(3),
		"gpurouter.admission.reason": "saturated", "gpurouter.admission.cost_tokens": int64(164), "gpurouter.admission.outcome": "admitted"})
	if !q.StartTime.Equal(at(1)) || !q.EndTime.Equal(at(5)) {
		t.Errorf("wait %v–%v", q.StartTime, q.EndTime)
	}

	picks := m[SpanPick]
	if len(picks) != 3 {
		t.Fatalf("%d picks", len(picks))
	}
	wantAttrs(t, picks[0], map[string]any{"gpurouter.pick.policy": "predictive", "gpurouter.replica": "r1",
		"gpurouter.attempt": int64(1), "gpurouter.pick.candidates": int64(3), "gpurouter.pick.cached_tokens": int64(32),
		"gpurouter.pick.predicted_ttft_seconds": 0.04, "gpurouter.pick.predicted_tpot_seconds": 0.01,
		"gpurouter.pick.reason": "least_ttft"})
	wantAttrs(t, picks[2], map[string]any{"gpurouter.replica": "r3", "gpurouter.attempt": int64(3)})

	attempts := m["chat llama-alias"]
	if len(attempts) != 3 {
		t.Fatalf("%d attempts:\n%v", len(attempts), names(spans))
	}
	for i, a := range attempts {
		if a.SpanKind != trace.SpanKindClient {
			t.Errorf("attempt %d kind %v", i+1, a.SpanKind)
		}
	}
	wantAttrs(t, attempts[0], map[string]any{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm",
		"gen_ai.request.model": "llama-alias", "server.address": "127.0.0.1", "server.port": int64(9001),
		"gpurouter.replica": "r1", "gpurouter.attempt": int64(1), "gpurouter.retry_reason": "connect_error",
		"error.type": "connect"})
	if attempts[0].Status.Code != codes.Error {
		t.Errorf("failed attempt status %v", attempts[0].Status)
	}
	wantAttrs(t, attempts[1], map[string]any{"http.request.resend_count": int64(1), "http.response.status_code": int64(200),
		"error.type": "reset"})
	if ev := eventNames(attempts[1]); !reflect.DeepEqual(ev, []string{EventConnected, EventFirstByte}) {
		t.Errorf("attempt 2 events %v", ev)
	}
	// The last attempt served the response: End closed it with the usage.
	wantAttrs(t, attempts[2], map[string]any{"server.address": "::1", "server.port": int64(9003),
		"gpurouter.migration.hop": int64(1), "http.request.resend_count": int64(2), "gen_ai.usage.output_tokens": int64(10),
		"gen_ai.response.finish_reasons": []string{"length"}})
	if attempts[2].Status.Code != codes.Unset || !attempts[2].EndTime.Equal(at(100)) {
		t.Errorf("serving attempt status %v, end %v", attempts[2].Status, attempts[2].EndTime)
	}
	if _, ok := attrs(attempts[2])["error.type"]; ok {
		t.Error("serving attempt has an error.type")
	}

	rel := one(t, m, SpanRelay)
	wantAttrs(t, rel, map[string]any{"gpurouter.relay.ttft_seconds": 0.04, "gpurouter.relay.tpot_seconds": 0.01,
		"gpurouter.relay.chunks": int64(10), "gpurouter.relay.output_tokens": int64(10), "gpurouter.relay.itl_count": int64(9),
		"gpurouter.relay.itl_mean_seconds": 0.006, "gpurouter.relay.itl_max_seconds": 0.02})
	if ev := eventNames(rel); !reflect.DeepEqual(ev, []string{EventFirstToken}) || !rel.Events[0].Time.Equal(at(40)) {
		t.Errorf("relay events %v", rel.Events)
	}
	hop := one(t, m, SpanMigration)
	wantAttrs(t, hop, map[string]any{"gpurouter.migration.hop": int64(1), "gpurouter.migration.from": "r2",
		"gpurouter.migration.to": "r3", "gpurouter.migration.reason": "reset", "gpurouter.migration.relayed_tokens": int64(5)})

	// The engine request carried the last attempt's span, and the
	// client's trace state.
	sc := RemoteSpanContext(up)
	if sc.SpanID() != attempts[2].SpanContext.SpanID() || sc.TraceID() != req.SpanContext.TraceID() || !sc.IsSampled() {
		t.Errorf("engine traceparent %q, want the last attempt %s", up.Peek("traceparent"), attempts[2].SpanContext.SpanID())
	}
	if got := string(up.Peek("tracestate")); got != "vendor=x" {
		t.Errorf("engine tracestate %q", got)
	}
}

// TestRequestNewTrace: without a traceparent (or with one that does not
// parse) the router starts the trace, and the engine's parent is the
// router's attempt.
func TestRequestNewTrace(t *testing.T) {
	for name, tp := range map[string]string{"none": "", "invalid": "00-zz-00f067aa0ba902b7-01",
		"zero trace id": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		t.Run(name, func(t *testing.T) {
			tr, exp := newMemTracer(t, Config{})
			up := &fasthttp.RequestHeader{}
			up.Set("tracestate", "stale=1") // the client's, copied: Inject removes it
			exampleRequest(tr, clientHeader(tp, "vendor=x"), up)
			m := byName(flushed(t, tr, exp))
			req := one(t, m, "POST /v1/chat/completions")
			if req.Parent.IsValid() {
				t.Errorf("request has parent %v", req.Parent)
			}
			last := m["chat llama-alias"][2]
			if sc := RemoteSpanContext(up); sc.SpanID() != last.SpanContext.SpanID() || sc.TraceID() != req.SpanContext.TraceID() {
				t.Errorf("engine traceparent %q, want span %s of trace %s", up.Peek("traceparent"), last.SpanContext.SpanID(), req.SpanContext.TraceID())
			}
			if v := up.Peek("tracestate"); v != nil {
				t.Errorf("engine tracestate %q: want none beside the router's traceparent", v)
			}
		})
	}
}

// TestRequestSampling: the caller's sampled flag decides; the ratio
// decides the traces the router starts. Either way the engine gets a
// traceparent carrying the decision, so it records the same requests.
func TestRequestSampling(t *testing.T) {
	zero, one := 0.0, 1.0
	tests := []struct {
		name   string
		ratio  *float64
		tp     string
		record bool
	}{
		{"ratio 1, no parent", &one, "", true},
		{"ratio 0, no parent", &zero, "", false},
		{"ratio 0, sampled parent", &zero, clientTP, true},
		{"ratio 1, unsampled parent", &one, "00-" + clientTrace + "-" + clientSpan + "-00", false},
		{"default ratio", nil, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, exp := newMemTracer(t, Config{SamplingRatio: tt.ratio})
			up := &fasthttp.RequestHeader{}
			r := exampleRequest(tr, clientHeader(tt.tp, ""), up)
			if r.Recording() != tt.record {
				t.Errorf("Recording() = %v, want %v", r.Recording(), tt.record)
			}
			n := len(flushed(t, tr, exp))
			if want := map[bool]int{true: exampleSpans, false: 0}[tt.record]; n != want {
				t.Errorf("%d spans exported, want %d", n, want)
			}
			sc := RemoteSpanContext(up)
			if !sc.IsValid() || sc.IsSampled() != tt.record || sc.TraceID() != r.SpanContext().TraceID() {
				t.Errorf("engine traceparent %q: want the request's trace, sampled=%v", up.Peek("traceparent"), tt.record)
			}
			if tt.tp != "" && sc.TraceID().String() != clientTrace {
				t.Errorf("trace %s, want the client's", sc.TraceID())
			}
		})
	}
}

// TestRequestEndClosesOpenSteps: a request that ends mid-step (a client
// gone while queued, a stream cut) leaves no span unended, and calls
// after End do nothing.
func TestRequestEndClosesOpenSteps(t *testing.T) {
	tr, exp := newMemTracer(t, Config{})
	r := tr.StartRequest(nil, RequestInfo{Path: "/v1/completions", Model: "m"}, at(0))
	r.QueueStart(at(1), Queued{Position: 0, Length: 1})
	r.AttemptStart(at(2), Attempt{Replica: "r1", Address: "h:1"}) // the wiring's bug; still ends
	r.RelayStart(at(3))
	r.MigrationStart(at(4), Migration{Hop: 1, From: "r1"})
	r.End(at(5), Result{Status: 499, Outcome: "client_gone", ErrorType: "client_gone"})
	r.End(at(6), Result{Status: 200})
	r.AttemptStart(at(7), Attempt{Replica: "r2"})
	r.QueueStart(at(7), Queued{})
	spans := flushed(t, tr, exp)
	if len(spans) != 5 {
		t.Fatalf("%d spans, want 5:\n%v", len(spans), names(spans))
	}
	for _, s := range spans {
		if !s.EndTime.Equal(at(5)) {
			t.Errorf("%s ended at %v, want at End's %v", s.Name, s.EndTime, at(5))
		}
	}
	m := byName(spans)
	req := one(t, m, "request")
	if req.Status.Code != codes.Error || attrs(req)["error.type"] != "client_gone" {
		t.Errorf("request status %v, attrs %v", req.Status, attrs(req))
	}
	if a := attrs(one(t, m, SpanAdmission)); a["gpurouter.admission.outcome"] != "ended" {
		t.Errorf("wait attrs %v", a)
	}
	if a := one(t, m, "text_completion m"); a.SpanKind != trace.SpanKindClient {
		t.Errorf("attempt %v", a)
	}
}

// TestRequestErrorStatus: a 5xx fails the request span (typed by its
// status), a client's 4xx does not; an attempt's 4xx does.
func TestRequestErrorStatus(t *testing.T) {
	tr, exp := newMemTracer(t, Config{})
	for _, status := range []int{404, 503} {
		r := tr.StartRequest(nil, RequestInfo{Method: "POST", Path: "/v1/completions"}, at(0))
		r.AttemptStart(at(1), Attempt{})
		r.AttemptEnd(at(2), AttemptResult{Status: status})
		r.End(at(3), Result{Status: status})
	}
	spans := byName(flushed(t, tr, exp))
	reqs, tries := spans["POST /v1/completions"], spans["text_completion"]
	if len(reqs) != 2 || len(tries) != 2 {
		t.Fatalf("spans %v", spans)
	}
	for i, want := range []struct {
		req codes.Code
		typ any
	}{{codes.Unset, nil}, {codes.Error, "503"}} {
		if reqs[i].Status.Code != want.req || attrs(reqs[i])["error.type"] != want.typ {
			t.Errorf("request %d: status %v, error.type %v", i, reqs[i].Status, attrs(reqs[i])["error.type"])
		}
		if tries[i].Status.Code != codes.Error {
			t.Errorf("attempt %d: status %v", i, tries[i].Status)
		}
	}
}

// TestNilRequest: tracing off, every method is safe and writes nothing.
func TestNilRequest(t *testing.T) {
	var tr *Tracer
	off, err := New(context.Background(), Config{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range []*Tracer{tr, off, {}} {
		if tr.Enabled() {
			t.Fatal("enabled")
		}
		up := &fasthttp.RequestHeader{}
		up.Set("traceparent", clientTP)
		r := exampleRequest(tr, clientHeader(clientTP, ""), up)
		if r != nil || r.Recording() || r.SpanContext().IsValid() || len(r.AppendTraceID(nil)) != 0 || len(r.AppendHeaderLines(nil)) != 0 {
			t.Errorf("off: %v", r)
		}
		if got := string(up.Peek("traceparent")); got != clientTP {
			t.Errorf("off: the client's traceparent became %q", got)
		}
		if err := tr.ForceFlush(context.Background()); err != nil {
			t.Error(err)
		}
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}
}

// TestOffAllocatesNothing: off, a whole request's calls allocate nothing
// (BenchmarkRequest measures the time).
func TestOffAllocatesNothing(t *testing.T) {
	off, err := New(context.Background(), Config{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	client, up := clientHeader(clientTP, "vendor=x"), &fasthttp.RequestHeader{}
	for name, tr := range map[string]*Tracer{"nil": nil, "New(zero Config)": off} {
		if n := testing.AllocsPerRun(100, func() {
			r := exampleRequest(tr, client, up)
			_ = r.AppendHeaderLines(nil)
		}); n != 0 {
			t.Errorf("%s: %v allocations per request, want 0", name, n)
		}
	}
}

// TestAppendTraceID: the access log's trace id is the span context's.
func TestAppendTraceID(t *testing.T) {
	tr, _ := newMemTracer(t, Config{})
	r := tr.StartRequest(clientHeader(clientTP, ""), RequestInfo{}, at(0))
	if got := string(r.AppendTraceID([]byte("trace_id="))); got != "trace_id="+clientTrace {
		t.Errorf("got %q", got)
	}
	r.End(at(1), Result{})
}

func one(t *testing.T, m map[string][]tracetest.SpanStub, name string) tracetest.SpanStub {
	t.Helper()
	if len(m[name]) != 1 {
		t.Fatalf("%d spans named %q; have %v", len(m[name]), name, keys(m))
	}
	return m[name][0]
}

func wantAttrs(t *testing.T, s tracetest.SpanStub, want map[string]any) {
	t.Helper()
	got := attrs(s)
	for k, v := range want {
		if !reflect.DeepEqual(got[k], v) {
			t.Errorf("%s: %s = %#v, want %#v", s.Name, k, got[k], v)
		}
	}
}

func eventNames(s tracetest.SpanStub) []string {
	var out []string
	for _, e := range s.Events {
		out = append(out, e.Name)
	}
	return out
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
