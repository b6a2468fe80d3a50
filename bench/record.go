package bench

import (
	"fmt"
	"time"
)

// Failure reasons of a Record. HTTP errors are "http_" plus the status code
// (ReasonHTTP).
const (
	ReasonConnect      = "connect"       // could not open a connection
	ReasonTimeout      = "timeout"       // Config.Timeout passed
	ReasonTransport    = "transport"     // connection failed before a response arrived
	ReasonBrokenStream = "broken_stream" // the stream ended without data: [DONE]
	ReasonStreamError  = "stream_error"  // the server sent data: {"error": …}
	ReasonNoContent    = "no_content"    // [DONE] before any chunk with output
	ReasonCanceled     = "canceled"      // the run's context ended first
)

// ReasonHTTP is the failure reason for a non-200 response.
func ReasonHTTP(status int) string { return fmt.Sprintf("http_%d", status) }

// Record is what the load generator measured for one request. Offsets are
// from Result.Start; durations are as measured by Config.Clock. The zero
// value is a request that was never sent.
type Record struct {
	// Index is the request's position in Config.Requests (for warm-ups,
	// the warm-up number).
	Index int
	// ID is the X-Request-Id sent, to match the router's records.
	ID string
	// UseCase is copied from the Request.
	UseCase string
	// Model is the Request's own model (a LoRA adapter); "" when it used
	// Config.Model.
	Model string
	// PromptTokens is the prompt length: the server's usage.prompt_tokens
	// when it reported one (as vllm bench does), else the Request's.
	PromptTokens int
	// MaxTokens is the output length asked for (max_tokens).
	MaxTokens int
	// OutputTokens is usage.completion_tokens when reported, else the
	// number of token chunks.
	OutputTokens int
	// UsageReported says OutputTokens came from the server's usage chunk.
	UsageReported bool
	// Chunks is the number of SSE chunks that carried output.
	Chunks int

	// Scheduled is when the arrival process wanted the request sent.
	Scheduled time.Duration
	// Sent is when it was handed to the connection (vllm's "st").
	Sent time.Duration
	// ClientQueue is the part of Sent−Scheduled spent waiting for a
	// --max-concurrency slot (vllm's client_queue_time).
	ClientQueue time.Duration
	// Lag is the rest of Sent−Scheduled: the load generator's own delay
	// (timer lateness, scheduling, building the body). Large values mean the
	// generator, not the server, shaped the load.
	Lag time.Duration
	// TTFT is the first chunk carrying output minus Sent.
	TTFT time.Duration
	// ITLs are the gaps between consecutive output chunks.
	ITLs []time.Duration
	// E2E is the last output chunk minus Sent.
	E2E time.Duration
	// End is when the request finished, successfully or not.
	End time.Duration

	// Status is the HTTP status, 0 when no response arrived.
	Status int
	// Reason is "" for a success, else one of the Reason* values.
	Reason string
	// Error describes a failure for humans.
	Error string
}

// OK reports whether the request succeeded: a 200 stream with at least one
// output chunk that ended with data: [DONE].
func (r *Record) OK() bool { return r.Reason == "" && r.Chunks > 0 }

// TPOT is (E2E − TTFT) / (OutputTokens − 1), the mean time per output token
// after the first; 0 for requests with fewer than two tokens.
func (r *Record) TPOT() time.Duration {
	if r.OutputTokens < 2 {
		return 0
	}
	return (r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1)
}
