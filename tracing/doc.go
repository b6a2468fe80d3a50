// Package tracing is the router's OpenTelemetry tracing: one trace per
// request, from the client through the router's steps to the engine,
// exported over OTLP (gRPC or HTTP) to a Collector or any OTLP backend.
//
// # The spans of one request
//
//	POST /v1/chat/completions      SERVER  the request, received → response ended
//	├─ gpurouter.admission         INTERNAL the wait for admission (only when it waited): queue position, why
//	├─ gpurouter.pick              INTERNAL one per attempt: policy, replica, predicted TTFT/TPOT, cached tokens
//	├─ chat MODEL                  CLIENT   one per attempt: replica, connect and first-byte events, status, retry reason
//	│  └─ (the engine's own span: vLLM's llm_request continues the attempt's traceparent)
//	├─ gpurouter.relay             INTERNAL the response to the client: TTFT, tokens, ITL mean/max
//	└─ gpurouter.migration         INTERNAL one per hop of a stream moved to another replica
//
// The attempt is the GenAI inference client span of the OpenTelemetry
// semantic conventions (gen_ai.operation.name, gen_ai.provider.name,
// gen_ai.request.model, server.address/port, gen_ai.usage.*); the request
// span is an HTTP server span that carries the GenAI request and usage
// attributes too. The router's own attributes are under gpurouter.*,
// durations in seconds. attrs.go lists every key.
//
// # Trace context
//
// A request that brings a W3C traceparent (and tracestate) continues that
// trace; without one (or with one that does not parse) the router starts a
// trace. The engine request carries the open attempt's span as its parent
// (Request.Inject for a fasthttp request, Request.AppendHeaderLines for
// one written as bytes), replacing the client's trace headers
// (IsTraceHeader), so vLLM started with --otlp-traces-endpoint records its
// span under the router's. Sampling is parent-based: a caller's sampled
// flag decides, and Config.SamplingRatio decides the traces the router
// starts; the decision travels to the engine in the traceparent's flags.
//
// # Off costs nothing
//
// Tracing is off unless Config names an endpoint. Off, StartRequest
// returns a nil *Request without reading the request, every method of a
// nil *Request returns at once, and the client's trace headers pass to
// the engine untouched: no allocation (TestOffAllocatesNothing,
// BenchmarkRequest). A request sampled out keeps only what propagation
// needs: its server span's context, no child spans, no attributes.
//
// # Wiring
//
// The command builds one Tracer (New) and shuts it down after the drain
// (Shutdown); the request path calls, per request: StartRequest once
// parsed, QueueStart/QueueEnd around a wait, Picked after each pick,
// AttemptStart/Inject/AttemptConnected/AttemptFirstByte/AttemptEnd per
// attempt, RelayStart/FirstToken/RelayEnd around the relay,
// MigrationStart/MigrationEnd per hop, and End when the response ends
// (which ends whatever is still open, the serving attempt included). Every
// step takes the time it happened, from the router's own clock.
//
// The package holds no process-wide state: it sets neither OpenTelemetry's
// global tracer provider nor its propagator nor its error handler.
package tracing
