package tracing

import (
	"context"
	"encoding/hex"
	"net"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Operation is a request's gen_ai.operation.name.
type Operation string

const (
	OperationChat           Operation = "chat"            // /v1/chat/completions
	OperationTextCompletion Operation = "text_completion" // /v1/completions
	OperationEmbeddings     Operation = "embeddings"      // /v1/embeddings
)

// OperationFor is the operation an OpenAI-compatible path serves; "" for
// a path that is neither.
func OperationFor(path string) Operation {
	switch path {
	case "/v1/chat/completions":
		return OperationChat
	case "/v1/completions":
		return OperationTextCompletion
	case "/v1/embeddings":
		return OperationEmbeddings
	}
	return ""
}

// RequestInfo is what the router knows of a request once it has parsed
// it. A zero field is left out of the span.
type RequestInfo struct {
	ID     string // X-Request-Id
	Method string // POST
	Path   string // /v1/chat/completions
	// Operation is chat, text_completion or embeddings; "" means
	// OperationFor(Path).
	Operation Operation
	Model     string // as the client named it
	Pool      string // the pool's model name, when an alias or a path prefix chose it
	// Provider is the engine serving the pool (vllm, sglang, llamacpp,
	// tgi): the GenAI "provider" of the attempts.
	Provider             string
	Stream               bool
	MaxTokens            int // the client's max_tokens (after any cap); 0 = not given
	EstimatedInputTokens int // the router's estimate of the prompt
	Priority             int // admission class
	Tenant               string
}

// Request is one request's spans: the server span and, under it, the
// admission wait, each pick, each attempt, the relay and each migration
// hop. Its methods take the time of the step (the router's own clock, so
// spans and metrics agree) and end any span of that kind still open, so a
// step reported twice or out of order never leaves a span unended; End
// ends every one. A nil *Request is tracing off: each method is a no-op
// and allocates nothing. A Request is used by one goroutine at a time, as
// the router's exchange is.
type Request struct {
	t    *Tracer
	ctx  context.Context // holds span: the parent of the steps
	span trace.Span      // nil once ended
	sc   trace.SpanContext
	rec  bool // span records; false: sampled out, only propagation left

	// tracestate is the trace's tracestate header value (nil: none), and
	// traceparent the scratch its traceparent is written into: the
	// request's own, so that injecting allocates nothing.
	tracestate  []byte
	traceparent [traceparentLen]byte

	op       Operation
	model    string
	provider string
	attempts int // attempts started so far
	hop      int // the migration hop the next attempt continues (0: none)

	queue, attempt, relay, migration trace.Span // open steps; nil when none
}

// StartRequest starts the span of a request the router received at at,
// under the trace context h carries (none: a new trace), and returns the
// handle the later steps report to. nil when t is off, without reading h.
func (t *Tracer) StartRequest(h HeaderGetter, info RequestInfo, at time.Time) *Request {
	if !t.Enabled() {
		return nil
	}
	return t.startRequest(h, info, at)
}

func (t *Tracer) startRequest(h HeaderGetter, info RequestInfo, at time.Time) *Request {
	op := info.Operation
	if op == "" {
		op = OperationFor(info.Path)
	}
	// Named after the sampling decision: a request sampled out costs no
	// name and no attributes.
	ctx, span := t.tracer.Start(extract(h), "request", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(at))
	r := &Request{t: t, ctx: ctx, span: span, sc: span.SpanContext(), rec: span.IsRecording(),
		op: op, model: info.Model, provider: info.Provider}
	if ts := r.sc.TraceState(); ts.Len() > 0 {
		r.tracestate = []byte(ts.String()) // every span of the trace has it: written once
	}
	if !r.rec {
		return r
	}
	span.SetName(serverSpanName(info.Method, info.Path))
	a := make([]attribute.KeyValue, 0, 14)
	a = appendString(a, AttrHTTPMethod, info.Method)
	a = appendString(a, AttrURLPath, info.Path)
	a = appendString(a, AttrOperation, string(op))
	a = appendString(a, AttrProvider, info.Provider)
	a = appendString(a, AttrRequestModel, info.Model)
	a = appendInt(a, AttrMaxTokens, info.MaxTokens)
	a = appendString(a, AttrRequestID, info.ID)
	if info.Pool != info.Model {
		a = appendString(a, AttrPool, info.Pool)
	}
	a = append(a, AttrStream.Bool(info.Stream), AttrPriority.Int(info.Priority))
	a = appendInt(a, AttrEstimatedInput, info.EstimatedInputTokens)
	a = appendString(a, AttrTenant, info.Tenant)
	span.SetAttributes(a...)
	return r
}

func serverSpanName(method, path string) string {
	switch {
	case method == "":
		return "request"
	case path == "":
		return method
	}
	return method + " " + path
}

// Recording reports whether r's spans are recorded (r is on and its trace
// sampled): the request path may test it before gathering attributes.
func (r *Request) Recording() bool { return r != nil && r.rec }

// SpanContext is the request span's context (its trace id for logs);
// invalid for a nil Request.
func (r *Request) SpanContext() trace.SpanContext {
	if r == nil {
		return trace.SpanContext{}
	}
	return r.sc
}

// AppendTraceID appends the request's trace id in hex (32 digits), e.g.
// for the access log; nothing for a nil Request.
func (r *Request) AppendTraceID(dst []byte) []byte {
	if r == nil {
		return dst
	}
	tid := r.sc.TraceID()
	return hex.AppendEncode(dst, tid[:])
}

// Inject writes the trace context the engine continues into the request
// for it: the open attempt's span (the request's when no attempt is open,
// or the request is sampled out) as the parent. It replaces a client's
// traceparent and tracestate. No-op for a nil Request.
func (r *Request) Inject(h HeaderSetter) {
	if r != nil {
		inject(h, appendTraceparent(r.traceparent[:0], r.engineParent()), r.tracestate)
	}
}

// AppendHeaderLines appends the header lines Inject would set, as
// "traceparent: ...\r\n" (and "tracestate: ...\r\n"), for a request
// written as bytes; the client's own trace headers must have been left
// out (IsTraceHeader). Appends nothing for a nil Request.
func (r *Request) AppendHeaderLines(dst []byte) []byte {
	if r == nil {
		return dst
	}
	return appendHeaderLines(dst, r.engineParent(), r.tracestate)
}

func (r *Request) engineParent() trace.SpanContext {
	if r.attempt != nil {
		return r.attempt.SpanContext()
	}
	return r.sc
}

// Usage is what the engine reported of a completed request (its usage
// chunk or body). A zero field is left out.
type Usage struct {
	InputTokens       int
	OutputTokens      int
	CachedInputTokens int // prompt tokens the engine read from its prefix cache
	ResponseID        string
	ResponseModel     string
	FinishReasons     []string
}

func (u Usage) attrs(a []attribute.KeyValue) []attribute.KeyValue {
	a = appendInt(a, AttrInputTokens, u.InputTokens)
	a = appendInt(a, AttrOutputTokens, u.OutputTokens)
	a = appendInt(a, AttrCachedTokens, u.CachedInputTokens)
	a = appendString(a, AttrResponseID, u.ResponseID)
	a = appendString(a, AttrResponseModel, u.ResponseModel)
	if len(u.FinishReasons) > 0 {
		a = append(a, AttrFinishReasons.StringSlice(u.FinishReasons))
	}
	return a
}

// Result is how a request ended. A zero field is left out.
type Result struct {
	Status int // HTTP status to the client (a stream that failed late is still 200)
	// Outcome is the router's outcome label, as in its metrics.
	Outcome string
	// ErrorType is a low-cardinality cause when the request failed ("" =
	// it did not): the OpenAI error code, or the outcome. A status of 500
	// or more without one is an error typed by its status.
	ErrorType string
	Usage     Usage
}

// End ends the request at at: first every step still open (an attempt
// still open is the one that served the response, and gets res's usage),
// then the request span with res. No-op for a nil Request; once ended,
// further calls do nothing.
func (r *Request) End(at time.Time, res Result) {
	if r != nil && r.span != nil {
		r.end(at, res)
	}
}

func (r *Request) end(at time.Time, res Result) {
	if r.rec {
		r.endOpen(at, res)
		a := make([]attribute.KeyValue, 0, 12)
		a = appendInt(a, AttrHTTPStatus, res.Status)
		a = appendString(a, AttrOutcome, res.Outcome)
		a = appendInt(a, AttrAttempts, r.attempts)
		a = res.Usage.attrs(a)
		errType := res.ErrorType
		if errType == "" && res.Status >= 500 {
			errType = strconv.Itoa(res.Status)
		}
		// A server span fails on what the router did wrong, not on a
		// client's 4xx (HTTP semantic conventions).
		setError(r.span, a, errType, res.Status >= 500 || res.ErrorType != "")
	}
	r.span.End(trace.WithTimestamp(at))
	r.span = nil
}

// endOpen ends the steps still open at at.
func (r *Request) endOpen(at time.Time, res Result) {
	if r.queue != nil {
		r.QueueEnd(at, "ended")
	}
	if r.migration != nil {
		r.MigrationEnd(at, "", "ended")
	}
	if r.relay != nil {
		endSpan(&r.relay, at)
	}
	if r.attempt != nil {
		r.AttemptEnd(at, AttemptResult{Status: res.Status, Usage: res.Usage})
	}
}

// live reports whether steps are recorded: r is on, sampled and not
// ended.
func (r *Request) live() bool { return r != nil && r.rec && r.span != nil }

// start starts a step under the request span.
func (r *Request) start(name string, kind trace.SpanKind, at time.Time, a []attribute.KeyValue) trace.Span {
	_, s := r.t.tracer.Start(r.ctx, name, trace.WithSpanKind(kind), trace.WithTimestamp(at), trace.WithAttributes(a...))
	return s
}

// endSpan ends *s at at and forgets it.
func endSpan(s *trace.Span, at time.Time) {
	(*s).End(trace.WithTimestamp(at))
	*s = nil
}

// setError sets a on s and, when failed, error.type and the span's
// error status.
func setError(s trace.Span, a []attribute.KeyValue, errType string, failed bool) {
	if failed {
		if errType == "" {
			errType = "_OTHER" // the conventions' fallback value
		}
		a = append(a, AttrErrorType.String(errType))
		s.SetStatus(codes.Error, errType)
	}
	s.SetAttributes(a...)
}

func appendString(a []attribute.KeyValue, k attribute.Key, v string) []attribute.KeyValue {
	if v == "" {
		return a
	}
	return append(a, k.String(v))
}

func appendInt(a []attribute.KeyValue, k attribute.Key, v int) []attribute.KeyValue {
	if v == 0 {
		return a
	}
	return append(a, k.Int(v))
}

func appendSeconds(a []attribute.KeyValue, k attribute.Key, d time.Duration) []attribute.KeyValue {
	if d == 0 {
		return a
	}
	return append(a, k.Float64(d.Seconds()))
}

// appendServer appends server.address and server.port of a host:port.
func appendServer(a []attribute.KeyValue, addr string) []attribute.KeyValue {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return appendString(a, AttrServerAddress, addr)
	}
	a = appendString(a, AttrServerAddress, host)
	if n, err := strconv.Atoi(port); err == nil {
		a = append(a, AttrServerPort.Int(n))
	}
	return a
}
