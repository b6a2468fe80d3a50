package tracing

import (
	"context"
	"encoding/hex"
	"reflect"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/tracing/otelcoltest"
	"github.com/valyala/fasthttp"
)

// TestCollectorReceivesRequestTrace: through a real OpenTelemetry
// Collector (OTLP receiver, file exporter), over each protocol, a
// request's spans arrive whole: the client's trace continued, every step
// under the request span, the engine's traceparent naming an attempt the
// Collector got, attributes typed as the conventions say, and the
// router's resource.
func TestCollectorReceivesRequestTrace(t *testing.T) {
	col := otelcoltest.Start(t)
	for i, tc := range []struct {
		proto    Protocol
		endpoint string
	}{
		{ProtocolGRPC, col.GRPCEndpoint},
		{ProtocolHTTP, col.HTTPEndpoint},
	} {
		t.Run(string(tc.proto), func(t *testing.T) {
			tr, err := New(context.Background(), Config{Endpoint: tc.endpoint, Protocol: tc.proto,
				ResourceAttributes: map[string]string{"deployment.environment.name": "ci"}},
				Options{ServiceVersion: "v-test", OnExportError: func(err error, n int) { t.Errorf("export of %d spans: %v", n, err) }})
			if err != nil {
				t.Fatal(err)
			}
			// A trace id of this subtest's own, so the two protocols'
			// spans tell apart in the one file.
			traceID := clientTrace[:30] + hex.EncodeToString([]byte{byte(i)})
			up := &fasthttp.RequestHeader{}
			exampleRequest(tr, clientHeader("00-"+traceID+"-"+clientSpan+"-01", "vendor=x"), up)
			// A request without trace context: a trace of the router's.
			own := tr.StartRequest(clientHeader("", ""), RequestInfo{Method: "POST", Path: "/v1/completions", Model: "m"}, at(0))
			own.End(at(1), Result{Status: 200})
			// Shutdown flushes: what was sent is in the Collector.
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}

			ownTrace := own.SpanContext().TraceID().String()
			spans := col.WaitForSpans(t, 30*time.Second, func(s []otelcoltest.Span) bool {
				return len(inTrace(s, traceID)) == exampleSpans && len(inTrace(s, ownTrace)) == 1
			})
			mine := inTrace(spans, traceID)
			byName := map[string][]otelcoltest.Span{}
			for _, s := range mine {
				byName[s.Name] = append(byName[s.Name], s)
			}
			req := byName["POST /v1/chat/completions"]
			if len(req) != 1 {
				t.Fatalf("request spans: %d\n%s", len(req), otelcoltest.Describe(mine))
			}
			root := req[0]
			if root.ParentSpanID != clientSpan || root.Kind != otelcoltest.KindServer || root.TraceState != "vendor=x" {
				t.Errorf("request span: parent %q kind %d state %q; want the client's span, server, the client's state",
					root.ParentSpanID, root.Kind, root.TraceState)
			}
			if !root.Start.Equal(at(0)) || !root.End.Equal(at(100)) {
				t.Errorf("request span %v–%v", root.Start, root.End)
			}
			for _, s := range mine {
				if s.SpanID != root.SpanID && s.ParentSpanID != root.SpanID {
					t.Errorf("%s's parent %s is not the request span %s", s.Name, s.ParentSpanID, root.SpanID)
				}
				if s.Scope != ScopeName {
					t.Errorf("%s scope %q", s.Name, s.Scope)
				}
			}
			for k, v := range map[string]any{"service.name": "gpurouter", "service.version": "v-test",
				"deployment.environment.name": "ci", "telemetry.sdk.language": "go"} {
				if root.Resource[k] != v {
					t.Errorf("resource %s = %v, want %v", k, root.Resource[k], v)
				}
			}
			wantAttrs := func(s otelcoltest.Span, want map[string]any) {
				t.Helper()
				for k, v := range want {
					if !reflect.DeepEqual(s.Attributes[k], v) {
						t.Errorf("%s: %s = %#v, want %#v", s.Name, k, s.Attributes[k], v)
					}
				}
			}
			wantAttrs(root, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.request.model": "llama-alias",
				"gen_ai.request.max_tokens": int64(64), "gpurouter.request.stream": true, "http.response.status_code": int64(200),
				"gen_ai.usage.output_tokens": int64(10), "gen_ai.response.finish_reasons": []any{"length"}})

			attempts := byName["chat llama-alias"]
			if len(attempts) != 3 {
				t.Fatalf("attempts: %d\n%s", len(attempts), otelcoltest.Describe(mine))
			}
			var last otelcoltest.Span
			for _, a := range attempts {
				if a.Kind != otelcoltest.KindClient {
					t.Errorf("attempt %v kind %d", a.Attributes["gpurouter.attempt"], a.Kind)
				}
				if a.Attributes["gpurouter.attempt"] == int64(3) {
					last = a
				}
				if a.Attributes["gpurouter.attempt"] == int64(1) && (a.Status.Code != otelcoltest.StatusError || a.Attributes["error.type"] != "connect") {
					t.Errorf("first attempt: status %v, attrs %v", a.Status, a.Attributes)
				}
			}
			wantAttrs(last, map[string]any{"server.address": "::1", "server.port": int64(9003), "gpurouter.replica": "r3",
				"gpurouter.migration.hop": int64(1), "http.response.status_code": int64(200)})
			if got := RemoteSpanContext(up); got.SpanID().String() != last.SpanID || got.TraceID().String() != traceID {
				t.Errorf("engine traceparent %q names no attempt the Collector got (last attempt %s)", up.Peek("traceparent"), last.SpanID)
			}
			if len(last.Events) != 2 || last.Events[0].Name != EventConnected || last.Events[1].Name != EventFirstByte || !last.Events[1].Time.Equal(at(70)) {
				t.Errorf("last attempt events %+v", last.Events)
			}
			for _, name := range []string{SpanAdmission, SpanRelay, SpanMigration} {
				if len(byName[name]) != 1 || byName[name][0].Kind != otelcoltest.KindInternal {
					t.Errorf("%s: %d spans", name, len(byName[name]))
				}
			}
			if len(byName[SpanPick]) != 3 {
				t.Errorf("picks: %d", len(byName[SpanPick]))
			}
			wantAttrs(byName[SpanRelay][0], map[string]any{"gpurouter.relay.ttft_seconds": 0.04, "gpurouter.relay.itl_count": int64(9)})
			wantAttrs(byName[SpanAdmission][0], map[string]any{"gpurouter.admission.queue_position": int64(2),
				"gpurouter.admission.reason": "saturated"})

			ownRoot := inTrace(spans, ownTrace)[0]
			if ownRoot.ParentSpanID != "" || ownRoot.Name != "POST /v1/completions" {
				t.Errorf("router's own trace: root %q with parent %q", ownRoot.Name, ownRoot.ParentSpanID)
			}
		})
	}
}

func inTrace(spans []otelcoltest.Span, traceID string) []otelcoltest.Span {
	var out []otelcoltest.Span
	for _, s := range spans {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}
