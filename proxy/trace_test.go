package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/bench/sim"
	"github.com/gpurouter/gpurouter/tracing"
	"github.com/gpurouter/gpurouter/tracing/otelcoltest"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// traceCase is one request of the tracing tests: what the client sends,
// with or without trace context of its own.
type traceCase struct {
	name, path, body string
	stream           bool
	traceID, spanID  string // the client's; "" sends no traceparent
}

// traceCases are a stream that continues the client's trace, a whole
// answer that continues another, and a request without trace context.
func traceCases(run int) []traceCase {
	tid := func(n int) string { return fmt.Sprintf("4bf92f3577b34da6a3ce929d0e0e%02x%02x", run, n) }
	return []traceCase{
		{name: "stream", path: "/v1/chat/completions", stream: true, traceID: tid(1), spanID: "00f067aa0ba902b7",
			body: `{"model":"m","messages":[{"role":"user","content":"tell me a story"}],"stream":true,"max_tokens":12,"ignore_eos":true}`},
		{name: "whole", path: "/v1/completions", traceID: tid(2), spanID: "00f067aa0ba902b8",
			body: `{"model":"m","prompt":"once upon a time","max_tokens":6,"ignore_eos":true}`},
		{name: "untraced", path: "/v1/completions", body: `{"model":"m","prompt":"hello","max_tokens":3}`},
	}
}

// send sends c to the router at url as request id id and reads the answer
// to its end.
func (c traceCase) send(t *testing.T, url, id string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+c.path, strings.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	if c.traceID != "" {
		req.Header.Set("traceparent", "00-"+c.traceID+"-"+c.spanID+"-01")
		req.Header.Set("tracestate", "vendor=x")
	}
	cl := &http.Client{Timeout: 30 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %v: %s", c.name, resp.StatusCode, err, b)
	}
	if c.stream && !strings.Contains(string(b), "data: [DONE]") {
		t.Fatalf("%s: stream without [DONE]: %s", c.name, b)
	}
}

// TestTracesThroughTheCollector is the acceptance test of the router's
// tracing (issue 55), on both request paths: requests through a router
// with tracing on, over simulated vLLM replicas and one replica that is
// down, their spans exported to a real OpenTelemetry Collector (OTLP
// receiver, file exporter), and what the Collector wrote checked: one
// trace per request, under the client's trace id when it sent one; the
// request, pick, attempt and relay spans with their attributes; the
// failed attempt on the replica that is down with its retry reason; and
// the traceparent the engine received naming the attempt span that
// reached it.
func TestTracesThroughTheCollector(t *testing.T) {
	col := otelcoltest.Start(t)
	fleet := simPair(t, 2, 1)
	urls := append([]string{closedPort(t)}, fleet.URLs()...)
	for run, goroutines := range []bool{false, true} {
		name := map[bool]string{false: "request loop", true: "goroutines"}[goroutines]
		t.Run(name, func(t *testing.T) {
			proto := []tracing.Protocol{tracing.ProtocolGRPC, tracing.ProtocolHTTP}[run]
			endpoint := []string{col.GRPCEndpoint, col.HTTPEndpoint}[run]
			tracer, err := tracing.New(context.Background(), tracing.Config{Endpoint: endpoint, Protocol: proto},
				tracing.Options{OnExportError: func(err error, n int) { t.Errorf("export of %d spans: %v", n, err) }})
			if err != nil {
				t.Fatal(err)
			}
			tr := startRouterWith(t, urls, func(o *Options) { o.Tracer = tracer },
				withPolicy("round_robin"), withConfig(func(c *Config) { c.GoroutineRequests = goroutines }))
			cases := traceCases(run)
			ids := make([]string, len(cases))
			for i, c := range cases {
				ids[i] = fmt.Sprintf("trace-%d-%s", run, c.name)
				c.send(t, tr.url, ids[i])
			}
			waitFor(t, "every request finished", func() bool { return tr.srv.Active() == 0 })
			// Shutdown exports what is queued: what was sent is in the
			// Collector.
			if err := tracer.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			engine := engineTraceparents(fleet)
			traceIDs := make([]string, len(cases))
			for i, c := range cases {
				traceIDs[i] = c.traceID
				if c.traceID == "" { // the router's own trace: the engine learnt it
					tp := engine[ids[i]]
					if len(tp) != 55 {
						t.Fatalf("%s: engine traceparent %q", c.name, tp)
					}
					traceIDs[i] = tp[3:35]
				}
			}
			spans := col.WaitForSpans(t, 30*time.Second, func(s []otelcoltest.Span) bool {
				for _, id := range traceIDs {
					if n := len(spansOf(s, id, "")); n < 4 { // request, pick, attempt, relay at least
						return false
					}
				}
				return true
			})
			retried := 0
			for i, c := range cases {
				retried += checkTrace(t, c, traceIDs[i], spansOf(spans, traceIDs[i], ""), engine[ids[i]])
			}
			if retried != 1 {
				t.Errorf("%d requests retried after the replica that is down, want 1 (the first to pick it)", retried)
			}
		})
	}
}

// checkTrace checks the spans of one request's trace and returns the
// number of its attempts that failed on the replica that is down.
func checkTrace(t *testing.T, c traceCase, traceID string, spans []otelcoltest.Span, engineTP string) (failed int) {
	t.Helper()
	desc := func() string { return otelcoltest.Describe(spans) }
	byName := map[string][]otelcoltest.Span{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
	}
	roots := byName["POST "+c.path]
	if len(roots) != 1 {
		t.Fatalf("%s: %d request spans in trace %s\n%s", c.name, len(roots), traceID, desc())
	}
	root := roots[0]
	wantParent, wantState := c.spanID, "vendor=x"
	if c.traceID == "" {
		wantParent, wantState = "", ""
	}
	if root.Kind != otelcoltest.KindServer || root.ParentSpanID != wantParent || root.TraceState != wantState {
		t.Errorf("%s: request span kind %d, parent %q, state %q; want server, %q, %q", c.name, root.Kind, root.ParentSpanID,
			root.TraceState, wantParent, wantState)
	}
	op := map[string]string{"/v1/chat/completions": "chat", "/v1/completions": "text_completion"}[c.path]
	attrs(t, c.name, root, map[string]any{"gen_ai.operation.name": op, "gen_ai.request.model": "m",
		"http.request.method": "POST", "url.path": c.path, "http.response.status_code": int64(200), "gpurouter.outcome": "ok",
		"gpurouter.request.stream": c.stream})
	if n, ok := root.Attributes["gen_ai.usage.output_tokens"].(int64); !ok || n == 0 {
		t.Errorf("%s: output tokens %v", c.name, root.Attributes["gen_ai.usage.output_tokens"])
	}
	for _, s := range spans {
		if s.SpanID != root.SpanID && s.ParentSpanID != root.SpanID {
			t.Errorf("%s: span %s under %s, not the request span", c.name, s.Name, s.ParentSpanID)
		}
	}

	picks, tries := byName[tracing.SpanPick], byName[op+" m"]
	if len(picks) != len(tries) || len(tries) == 0 || len(tries) > 2 {
		t.Fatalf("%s: %d picks, %d attempts\n%s", c.name, len(picks), len(tries), desc())
	}
	for _, p := range picks {
		if p.Attributes["gpurouter.pick.policy"] != "round_robin" || p.Attributes["gpurouter.replica"] == "" {
			t.Errorf("%s: pick %v", c.name, p.Attributes)
		}
		if ttft, ok := p.Attributes["gpurouter.pick.predicted_ttft_seconds"].(float64); !ok || ttft <= 0 {
			t.Errorf("%s: pick's predicted TTFT %v", c.name, p.Attributes["gpurouter.pick.predicted_ttft_seconds"])
		}
	}
	var served otelcoltest.Span
	for _, a := range tries {
		if a.Kind != otelcoltest.KindClient {
			t.Errorf("%s: attempt kind %d", c.name, a.Kind)
		}
		if a.Attributes["gpurouter.replica"] == "r0" { // the replica that is down
			failed++
			attrs(t, c.name+" failed attempt", a, map[string]any{"error.type": "unreachable", "gpurouter.retry_reason": "unreachable"})
			if a.Status.Code != otelcoltest.StatusError {
				t.Errorf("%s: failed attempt's status %+v", c.name, a.Status)
			}
			continue
		}
		served = a
	}
	attrs(t, c.name+" attempt", served, map[string]any{"gen_ai.operation.name": op, "gen_ai.request.model": "m",
		"server.address": "127.0.0.1", "http.response.status_code": int64(200)})
	var events []string
	for _, e := range served.Events {
		events = append(events, e.Name)
	}
	if strings.Join(events, ",") != tracing.EventConnected+","+tracing.EventFirstByte {
		t.Errorf("%s: attempt events %v", c.name, events)
	}
	// The engine continues the router's attempt, not the client's span.
	if want := "00-" + traceID + "-" + served.SpanID + "-01"; engineTP != want {
		t.Errorf("%s: the engine got traceparent %q, want %q (the attempt that reached it)", c.name, engineTP, want)
	}

	relay := byName[tracing.SpanRelay]
	if len(relay) != 1 {
		t.Fatalf("%s: %d relay spans\n%s", c.name, len(relay), desc())
	}
	if c.stream {
		if ttft, ok := relay[0].Attributes["gpurouter.relay.ttft_seconds"].(float64); !ok || ttft <= 0 {
			t.Errorf("%s: relay TTFT %v", c.name, relay[0].Attributes)
		}
		if n, ok := relay[0].Attributes["gpurouter.relay.itl_count"].(int64); !ok || n == 0 {
			t.Errorf("%s: relay ITL count %v", c.name, relay[0].Attributes)
		}
	}
	return failed
}

// attrs checks that s has the attributes want.
func attrs(t *testing.T, what string, s otelcoltest.Span, want map[string]any) {
	t.Helper()
	for k, v := range want {
		if s.Attributes[k] != v {
			t.Errorf("%s (%s): %s = %#v, want %#v", what, s.Name, k, s.Attributes[k], v)
		}
	}
}

// spansOf are the spans of trace id (named name, "" any).
func spansOf(spans []otelcoltest.Span, id, name string) []otelcoltest.Span {
	var out []otelcoltest.Span
	for _, s := range spans {
		if s.TraceID == id && (name == "" || s.Name == name) {
			out = append(out, s)
		}
	}
	return out
}

// engineTraceparents are the traceparents the fleet's replicas received,
// by request id.
func engineTraceparents(f *sim.Fleet) map[string]string {
	out := map[string]string{}
	for _, r := range f.Replicas() {
		for _, tc := range r.TraceContexts() {
			out[tc.RequestID] = tc.Traceparent
		}
	}
	return out
}

// TestTraceOfAnAdmissionWait: a request that waits for admission has the
// wait's span, on each request path — where it joined the queue, why it
// could not go at once and that it was admitted — under its request span.
func TestTraceOfAnAdmissionWait(t *testing.T) {
	for _, goroutines := range []bool{false, true} {
		t.Run(map[bool]string{false: "request loop", true: "goroutines"}[goroutines], func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tracer, err := tracing.New(context.Background(), tracing.Config{}, tracing.Options{Exporter: exp})
			if err != nil {
				t.Fatal(err)
			}
			up := newFakeVLLM(t)
			var ctl *admission.Controller
			tr := startRouterWith(t, []string{up.url}, func(o *Options) {
				o.Tracer = tracer
				if ctl, err = admission.New("m", admission.Config{}, admission.Deps{Pool: o.Routes[0].Pool}); err != nil {
					t.Fatal(err)
				}
				o.Routes[0].Admission = ctl
			}, withConfig(func(c *Config) { c.GoroutineRequests = goroutines }))
			// The replica's token budget is taken: the request waits.
			r0 := tr.reps[0]
			r0.SetEngineLoad(balancer.EngineLoad{Running: 1, KVUsage: 0.3, KVCapacityTokens: 30000, At: time.Now().Add(time.Hour)})
			held, err := r0.AcquireCostKV(0, 30000, false)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan int, 1)
			go func() {
				resp, err := http.Post(tr.url+"/v1/completions", "application/json",
					strings.NewReader(`{"model":"m","prompt":"hello there","max_tokens":4}`))
				if err != nil {
					done <- 0
					return
				}
				io.Copy(io.Discard, resp.Body) //nolint:errcheck
				resp.Body.Close()
				done <- resp.StatusCode
			}()
			waitFor(t, "the request queued", func() bool { return ctl.Queued() == 1 })
			held.Done(nil)
			ctl.Poke()
			select {
			case status := <-done:
				if status != http.StatusOK {
					t.Fatalf("status %d", status)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the request was not admitted")
			}
			waitFor(t, "the request finished", func() bool { return tr.srv.Active() == 0 })
			// (Not Shutdown: the in-memory exporter forgets at its own.)
			if err := tracer.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer tracer.Shutdown(context.Background()) //nolint:errcheck
			var root, wait *tracetest.SpanStub
			spans := exp.GetSpans()
			for i, s := range spans {
				switch s.Name {
				case "POST /v1/completions":
					root = &spans[i]
				case tracing.SpanAdmission:
					wait = &spans[i]
				}
			}
			if root == nil || wait == nil {
				t.Fatalf("spans %v: no request or no admission span", spans)
			}
			if wait.Parent.SpanID() != root.SpanContext.SpanID() {
				t.Errorf("the wait is under %s, not the request span", wait.Parent.SpanID())
			}
			got := map[string]any{}
			for _, kv := range wait.Attributes {
				got[string(kv.Key)] = kv.Value.AsInterface()
			}
			for k, v := range map[string]any{"gpurouter.admission.queue_position": int64(0), "gpurouter.admission.queue_length": int64(1),
				"gpurouter.admission.reason": "saturated", "gpurouter.admission.outcome": "admitted"} {
				if got[k] != v {
					t.Errorf("admission span: %s = %#v, want %#v", k, got[k], v)
				}
			}
		})
	}
}

// TestTraceOfAMigration: a stream moved off a replica being drained has
// the hop's span (from, to, why) and two attempts — the first ended by
// the drain, the second marked with the hop — and the replica it moved to
// got the second attempt as its traceparent.
func TestTraceOfAMigration(t *testing.T) {
	const n, tokens, grace = 2, 200, 50 * time.Millisecond
	f := simPair(t, 2, 2)
	exp := tracetest.NewInMemoryExporter()
	tracer, err := tracing.New(context.Background(), tracing.Config{}, tracing.Options{Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	defer tracer.Shutdown(context.Background()) //nolint:errcheck
	tr := startRouterWith(t, f.URLs(), func(o *Options) { o.Tracer = tracer; withMigration(Migration{Max: 1, DrainGrace: grace})(o) })
	r0, r1 := tr.reps[0], tr.reps[1]
	r1.SetDraining(true) // every stream starts on r0
	var seen atomic.Int64
	done := make(chan []streamSeen)
	go func() { done <- runStreams(tr.url, n, tokens, &seen) }()
	waitFor(t, "streams under way", func() bool { return seen.Load() >= n*20 })
	r1.SetDraining(false)
	r0.SetDraining(true)
	for i, s := range <-done {
		if !s.done || s.errEvent != "" {
			t.Fatalf("stream %d: [DONE] %v, error event %q", i, s.done, s.errEvent)
		}
	}
	waitFor(t, "the streams finished", func() bool { return tr.srv.Active() == 0 })
	if err := tracer.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	byTrace := map[string][]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		id := s.SpanContext.TraceID().String()
		byTrace[id] = append(byTrace[id], s)
	}
	if len(byTrace) != n {
		t.Fatalf("%d traces for %d streams", len(byTrace), n)
	}
	engine := map[string]bool{} // the traceparents r1 received
	for _, tc := range f.Replicas()[1].TraceContexts() {
		engine[tc.Traceparent] = true
	}
	for id, spans := range byTrace {
		var hops, tries []map[string]any
		var moved string
		for _, s := range spans {
			a := map[string]any{}
			for _, kv := range s.Attributes {
				a[string(kv.Key)] = kv.Value.AsInterface()
			}
			switch {
			case s.Name == tracing.SpanMigration:
				hops = append(hops, a)
			case s.SpanKind == trace.SpanKindClient:
				tries = append(tries, a)
				if a["gpurouter.migration.hop"] == int64(1) {
					moved = "00-" + id + "-" + s.SpanContext.SpanID().String() + "-01"
				}
			}
		}
		if len(hops) != 1 || len(tries) != 2 {
			t.Fatalf("trace %s: %d hops, %d attempts", id, len(hops), len(tries))
		}
		for k, v := range map[string]any{"gpurouter.migration.hop": int64(1), "gpurouter.migration.from": "r0",
			"gpurouter.migration.to": "r1", "gpurouter.migration.reason": "drained"} {
			if hops[0][k] != v {
				t.Errorf("trace %s: hop's %s = %#v, want %#v", id, k, hops[0][k], v)
			}
		}
		if moved == "" || !engine[moved] {
			t.Errorf("trace %s: r1 got no traceparent naming the attempt that continued the stream (%q)", id, moved)
		}
	}
}
