package tracing

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Span names. The request is an HTTP server span named as HTTP's semantic
// conventions name one ("POST /v1/chat/completions"); each attempt is the
// GenAI inference client span, named "{gen_ai.operation.name}
// {gen_ai.request.model}" ("chat llama-3-8b"); the router's own steps are
// internal spans named here.
const (
	SpanAdmission = "gpurouter.admission"
	SpanPick      = "gpurouter.pick"
	SpanRelay     = "gpurouter.relay"
	SpanMigration = "gpurouter.migration"
)

// Event names on the attempt and relay spans.
const (
	EventConnected  = "gpurouter.connected"   // attempt: the connection to the replica is up
	EventFirstByte  = "gpurouter.first_byte"  // attempt: the engine's response head arrived
	EventFirstToken = "gpurouter.first_token" // relay: the first content chunk went to the client
)

// Attribute keys from the OpenTelemetry semantic conventions, where one
// means what the router records: GenAI's (gen_ai.*, spelled out: since
// v1.42.0 they live in their own registry, semantic-conventions-genai, which
// has no Go package) and v1.43.0's HTTP, server and error attributes.
const (
	AttrOperation     = attribute.Key("gen_ai.operation.name")                // chat | text_completion | embeddings
	AttrProvider      = attribute.Key("gen_ai.provider.name")                 // the engine serving the pool: vllm, sglang, ...
	AttrRequestModel  = attribute.Key("gen_ai.request.model")                 // the model the client asked for
	AttrMaxTokens     = attribute.Key("gen_ai.request.max_tokens")            // the client's max_tokens, when given
	AttrInputTokens   = attribute.Key("gen_ai.usage.input_tokens")            // the engine's usage: prompt tokens
	AttrOutputTokens  = attribute.Key("gen_ai.usage.output_tokens")           // the engine's usage: completion tokens
	AttrCachedTokens  = attribute.Key("gen_ai.usage.cache_read.input_tokens") // the engine's usage: prompt tokens read from its prefix cache
	AttrResponseID    = attribute.Key("gen_ai.response.id")                   // the completion's id
	AttrResponseModel = attribute.Key("gen_ai.response.model")                // the model that answered
	AttrFinishReasons = attribute.Key("gen_ai.response.finish_reasons")       // string[]: stop, length, ...
	AttrServerAddress = semconv.ServerAddressKey                              // attempt: the replica's host
	AttrServerPort    = semconv.ServerPortKey                                 // attempt: the replica's port
	AttrHTTPMethod    = semconv.HTTPRequestMethodKey                          // request: POST
	AttrURLPath       = semconv.URLPathKey                                    // request: /v1/chat/completions
	AttrHTTPStatus    = semconv.HTTPResponseStatusCodeKey                     // request: to the client; attempt: from the engine
	AttrResendCount   = semconv.HTTPRequestResendCountKey                     // attempt: how many tries came before it (absent on the first)
	AttrErrorType     = semconv.ErrorTypeKey                                  // a low-cardinality cause, on any span that failed
)

// The router's own attribute keys, under gpurouter.*: durations in
// seconds (a double), counts as integers.
const (
	// Request (the server span).
	AttrRequestID      = attribute.Key("gpurouter.request.id")                     // X-Request-Id
	AttrPool           = attribute.Key("gpurouter.pool")                           // the pool (its model name), when an alias or path named it
	AttrStream         = attribute.Key("gpurouter.request.stream")                 // bool
	AttrEstimatedInput = attribute.Key("gpurouter.request.estimated_input_tokens") // the router's estimate, before the engine counts
	AttrPriority       = attribute.Key("gpurouter.request.priority")               // admission class
	AttrTenant         = attribute.Key("gpurouter.request.tenant")                 // the API key's tenant
	AttrOutcome        = attribute.Key("gpurouter.outcome")                        // the router's outcome label (as in its metrics)
	AttrAttempts       = attribute.Key("gpurouter.attempts")                       // tries the request took

	// Admission wait.
	AttrQueuePosition = attribute.Key("gpurouter.admission.queue_position") // requests ahead of it when it joined
	AttrQueueLength   = attribute.Key("gpurouter.admission.queue_length")   // requests waiting then, itself included
	AttrQueueReason   = attribute.Key("gpurouter.admission.reason")         // why it had to wait
	AttrQueueCost     = attribute.Key("gpurouter.admission.cost_tokens")    // the work admission charged it
	AttrQueueOutcome  = attribute.Key("gpurouter.admission.outcome")        // admitted | shed | queue_full | ...

	// Pick and attempt.
	AttrPolicy        = attribute.Key("gpurouter.pick.policy")
	AttrArm           = attribute.Key("gpurouter.pick.arm") // A/B arm, when an experiment runs
	AttrCandidates    = attribute.Key("gpurouter.pick.candidates")
	AttrPickCached    = attribute.Key("gpurouter.pick.cached_tokens") // prompt tokens the picked replica is expected to hold
	AttrPredictedTTFT = attribute.Key("gpurouter.pick.predicted_ttft_seconds")
	AttrPredictedTPOT = attribute.Key("gpurouter.pick.predicted_tpot_seconds")
	AttrPickReason    = attribute.Key("gpurouter.pick.reason")
	AttrReplica       = attribute.Key("gpurouter.replica") // pick: chosen ("" none); attempt: sent to
	AttrAttempt       = attribute.Key("gpurouter.attempt") // 1-based: which try a pick or attempt is
	AttrRetryReason   = attribute.Key("gpurouter.retry_reason")

	// Relay.
	AttrTTFT       = attribute.Key("gpurouter.relay.ttft_seconds") // request received → first content chunk relayed
	AttrTPOT       = attribute.Key("gpurouter.relay.tpot_seconds")
	AttrChunks     = attribute.Key("gpurouter.relay.chunks")
	AttrRelayOut   = attribute.Key("gpurouter.relay.output_tokens")
	AttrITLCount   = attribute.Key("gpurouter.relay.itl_count")
	AttrITLMean    = attribute.Key("gpurouter.relay.itl_mean_seconds")
	AttrITLMax     = attribute.Key("gpurouter.relay.itl_max_seconds")
	AttrClientGone = attribute.Key("gpurouter.relay.client_gone")

	// Migration hops (also on the attempt that continues a stream).
	AttrHop        = attribute.Key("gpurouter.migration.hop") // 1 for the first move
	AttrHopFrom    = attribute.Key("gpurouter.migration.from")
	AttrHopTo      = attribute.Key("gpurouter.migration.to")
	AttrHopReason  = attribute.Key("gpurouter.migration.reason")
	AttrHopRelayed = attribute.Key("gpurouter.migration.relayed_tokens") // output tokens the client had before the move
)
