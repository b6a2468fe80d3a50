package sim

import (
	"sync"

	"github.com/valyala/fasthttp"
)

// TraceContext is the W3C trace context one inference request reached
// the replica with, as vLLM would continue it (--otlp-traces-endpoint):
// what lets a test check that the engine request names the router's span.
type TraceContext struct {
	RequestID   string // X-Request-Id, which ties it to the router's request
	Traceparent string // "" when the request had none
	Tracestate  string
}

// traceLogSize bounds the trace contexts a replica keeps: the most recent
// ones, so a long benchmark's replica holds a fixed amount.
const traceLogSize = 1024

// traceLog is a replica's ring of the trace contexts of its inference
// requests. The zero value is empty and ready.
type traceLog struct {
	mu   sync.Mutex
	ring []TraceContext // allocated at the first record
	next int            // where the next goes
	full bool           // the ring has wrapped
}

// record keeps the trace context of ctx's request when it is an inference
// request (POST /v1/chat/completions or /v1/completions), faults or not.
func (l *traceLog) record(ctx *fasthttp.RequestCtx, path string) {
	if !ctx.IsPost() || (path != "/v1/chat/completions" && path != "/v1/completions") {
		return
	}
	h := &ctx.Request.Header
	l.add(TraceContext{RequestID: string(h.Peek("X-Request-Id")),
		Traceparent: string(h.Peek("traceparent")), Tracestate: string(h.Peek("tracestate"))})
}

// add keeps tc, dropping the oldest when the ring is full.
func (l *traceLog) add(tc TraceContext) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ring == nil {
		l.ring = make([]TraceContext, traceLogSize)
	}
	l.ring[l.next] = tc
	l.next++
	if l.next == len(l.ring) {
		l.next, l.full = 0, true
	}
}

// TraceContexts are the trace contexts of the inference requests the
// replica received, oldest first: the last 1024 at most.
func (r *Replica) TraceContexts() []TraceContext {
	l := &r.traces
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.full {
		return append([]TraceContext(nil), l.ring[:l.next]...)
	}
	return append(append([]TraceContext(nil), l.ring[l.next:]...), l.ring[:l.next]...)
}
