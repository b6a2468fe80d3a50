package sim

import (
	"fmt"
	"reflect"
	"testing"
)

// TestTraceContexts: the replica keeps each inference request's trace
// context (none for a request without, nothing for other endpoints).
func TestTraceContexts(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	body := `{"model":"qwen","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	httpDo(t, "POST", u+"/v1/chat/completions", body, "X-Request-Id", "a", "traceparent", tp, "tracestate", "k=v")
	httpDo(t, "POST", u+"/v1/completions", `{"model":"qwen","max_tokens":1,"prompt":"hi"}`, "X-Request-Id", "b")
	httpDo(t, "GET", u+"/v1/models", "", "traceparent", tp)
	httpDo(t, "POST", u+"/tokenize", `{"model":"qwen","prompt":"hi"}`, "traceparent", tp)
	want := []TraceContext{{RequestID: "a", Traceparent: tp, Tracestate: "k=v"}, {RequestID: "b"}}
	if got := f.Replicas()[0].TraceContexts(); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// TestTraceLogRing: the log keeps the most recent traceLogSize, oldest
// first.
func TestTraceLogRing(t *testing.T) {
	var r Replica
	if got := r.TraceContexts(); len(got) != 0 {
		t.Fatalf("empty: %v", got)
	}
	for i := range traceLogSize + 3 {
		r.traces.add(TraceContext{RequestID: fmt.Sprint(i)})
	}
	got := r.TraceContexts()
	if len(got) != traceLogSize || got[0].RequestID != "3" || got[len(got)-1].RequestID != fmt.Sprint(traceLogSize+2) {
		t.Errorf("%d kept, first %q, last %q", len(got), got[0].RequestID, got[len(got)-1].RequestID)
	}
}
