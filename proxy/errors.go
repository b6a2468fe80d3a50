package proxy

import (
	"errors"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/h1"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/gpurouter/gpurouter/proxy/auth"
	"github.com/valyala/fasthttp"
)

// Sentinel errors of the request path. Every error that reaches a client is
// mapped to an HTTP status and an OpenAI error body in exactly one place,
// errorTable below; code elsewhere returns these (wrapped with detail).
var (
	ErrUnknownModel     = errors.New("model not found")
	ErrNotFound         = errors.New("not found")
	ErrMethodNotAllowed = errors.New("method not allowed")
	ErrBodyTooLarge     = errors.New("request body too large")
	ErrHeaderTooLarge   = errors.New("request headers too large")
	ErrRequestTimeout   = errors.New("request not received in time")
	ErrShed             = errors.New("request shed")
	ErrNoReplica        = errors.New("no healthy replica")
	ErrUpstream         = errors.New("upstream failed")
	ErrTimeout          = errors.New("upstream timed out")
	ErrClientGone       = errors.New("client disconnected")
	ErrShuttingDown     = errors.New("router shutting down")
)

// errorKind is what one sentinel means: how it looks to a client, how
// the request is recorded, and whether the replica is to blame.
type errorKind struct {
	err     error
	status  int
	typ     string  // OpenAI error "type"
	code    string  // OpenAI error "code"
	outcome outcome // the request's recorded outcome
	blame   blame   // what the replica's breaker makes of it
}

// blame is what an ending means for the replica's circuit breaker.
type blame uint8

const (
	blameNone    blame = iota // the replica did its part: a success to the breaker
	blameReplica              // the replica failed: counts against it
	blameNeutral              // not the replica's doing (the client left, the router stopped): neither
)

// errorTable maps sentinels to their meaning; the first match (errors.Is)
// wins. Anything not listed is a 500 and the replica's fault.
var errorTable = [...]errorKind{
	{openai.ErrBadRequest, fasthttp.StatusBadRequest, "invalid_request_error", "invalid_request", outcomeClientError, blameNone},
	// The request grammar's refusals (h1.ParseRequest, the front door):
	// each answered before anything acted on the request, and its
	// connection closed.
	{h1.ErrMalformed, fasthttp.StatusBadRequest, "invalid_request_error", "malformed_request", outcomeClientError, blameNone},
	{h1.ErrHeadTooLarge, fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "request_header_too_large", outcomeClientError, blameNone},
	{h1.ErrUnknownCoding, fasthttp.StatusNotImplemented, "invalid_request_error", "unsupported_transfer_coding", outcomeClientError, blameNone},
	{h1.ErrVersion, fasthttp.StatusHTTPVersionNotSupported, "invalid_request_error", "http_version_not_supported", outcomeClientError, blameNone},
	{ErrUnknownModel, fasthttp.StatusNotFound, "invalid_request_error", "model_not_found", outcomeClientError, blameNone},
	{ErrNotFound, fasthttp.StatusNotFound, "invalid_request_error", "not_found", outcomeClientError, blameNone},
	{auth.ErrUnauthorized, fasthttp.StatusUnauthorized, "invalid_request_error", "invalid_api_key", outcomeClientError, blameNone},
	{auth.ErrForbidden, fasthttp.StatusForbidden, "invalid_request_error", "model_not_allowed", outcomeClientError, blameNone},
	{auth.ErrRateLimited, fasthttp.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded", outcomeRateLimited, blameNone},
	{ErrMethodNotAllowed, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", outcomeClientError, blameNone},
	{ErrBodyTooLarge, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", outcomeClientError, blameNone},
	{ErrHeaderTooLarge, fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "request_header_too_large", outcomeClientError, blameNone},
	{ErrRequestTimeout, fasthttp.StatusRequestTimeout, "invalid_request_error", "request_timeout", outcomeClientError, blameNone},
	{ErrShed, fasthttp.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded", outcomeShed, blameNone},
	{admission.ErrDeadline, fasthttp.StatusTooManyRequests, "rate_limit_error", "deadline_unreachable", outcomeShed, blameNone},
	{admission.ErrShed, fasthttp.StatusTooManyRequests, "rate_limit_error", "queue_full", outcomeShed, blameNone},
	{ErrOverloaded, fasthttp.StatusTooManyRequests, "rate_limit_error", "engine_overloaded", outcomeShed, blameNeutral},
	{ErrUnavailable, fasthttp.StatusServiceUnavailable, "server_error", "engine_unavailable", outcomeShed, blameNeutral},
	{ErrNoReplica, fasthttp.StatusServiceUnavailable, "server_error", "no_healthy_replica", outcomeNoReplica, blameNone},
	// A LoRA adapter no replica serves or could load (lora_load.go):
	// Retry-After is when the router asks an engine to load it again.
	{ErrAdapterLoad, fasthttp.StatusServiceUnavailable, "server_error", "lora_adapter_unavailable", outcomeNoReplica, blameNone},
	{ErrShuttingDown, fasthttp.StatusServiceUnavailable, "server_error", "shutting_down", outcomeShutdown, blameNeutral},
	{ErrTimeout, fasthttp.StatusGatewayTimeout, "server_error", "upstream_timeout", outcomeTimeout, blameReplica},
	{errBrokenStream, fasthttp.StatusBadGateway, "server_error", "bad_upstream", outcomeBrokenStream, blameReplica},
	{ErrUpstream, fasthttp.StatusBadGateway, "server_error", "bad_upstream", outcomeUpstreamError, blameReplica},
	{ErrClientGone, 499, "invalid_request_error", "client_closed_request", outcomeCanceled, blameNeutral},
}

func classify(err error) errorKind {
	for _, k := range errorTable {
		if errors.Is(err, k.err) {
			return k
		}
	}
	return errorKind{err: err, status: fasthttp.StatusInternalServerError, typ: "server_error", code: "internal_error", outcome: outcomeUpstreamError, blame: blameReplica}
}

// outcomeOf is how a request that ended with err (nil for a response
// relayed whole) and status is recorded, and the error its replica's
// breaker is told: nil for a success, the error for a failure, the error
// joined with balancer.ErrNotReplicaFault for neither.
func outcomeOf(err error, status int) (outcome, error) {
	if err == nil {
		// The engine's own answer, passed on.
		switch {
		case status < 400:
			return outcomeOK, nil
		case status == fasthttp.StatusTooManyRequests:
			return outcomeShed, balancer.ErrNotReplicaFault
		case status < 500:
			return outcomeClientError, nil
		}
		return outcomeUpstreamError, errors.New("upstream status " + strconv.Itoa(status))
	}
	k := classify(err)
	switch k.blame {
	case blameReplica:
		return k.outcome, err
	case blameNeutral:
		return k.outcome, errors.Join(err, balancer.ErrNotReplicaFault)
	}
	return k.outcome, nil
}

// statusOf is the HTTP status an error maps to.
func statusOf(err error) int { return classify(err).status }

// appendErrorJSON appends {"error":{"message","type","param","code"}} for err.
func appendErrorJSON(dst []byte, err error) []byte {
	k := classify(err)
	var param string
	if pe := (*openai.ParamError)(nil); errors.As(err, &pe) {
		param = pe.Param
	}
	dst = append(dst, `{"error":{"message":`...)
	dst = strconv.AppendQuote(dst, err.Error())
	dst = append(dst, `,"type":`...)
	dst = strconv.AppendQuote(dst, k.typ)
	dst = append(dst, `,"param":`...)
	if param == "" {
		dst = append(dst, "null"...)
	} else {
		dst = strconv.AppendQuote(dst, param)
	}
	dst = append(dst, `,"code":`...)
	dst = strconv.AppendQuote(dst, k.code)
	return append(dst, "}}"...)
}

// retryAfterSeconds is the Retry-After hint carried by err (admission
// computes one from its queue, a key's rate limit from its bucket), else 1.
func retryAfterSeconds(err error) int {
	var ra interface{ RetryAfterSeconds() int }
	if errors.As(err, &ra) {
		if n := ra.RetryAfterSeconds(); n > 0 {
			return n
		}
	}
	var rd interface{ RetryAfter() time.Duration }
	if errors.As(err, &rd) {
		if d := rd.RetryAfter(); d > 0 {
			return int((d + time.Second - 1) / time.Second)
		}
	}
	return 1
}

// writeError answers the client with err's status and OpenAI error body.
func writeError(ctx *fasthttp.RequestCtx, err error) { setError(&ctx.Response, err) }

// setError makes resp the answer to err: its status and OpenAI error body.
func setError(resp *fasthttp.Response, err error) {
	k := classify(err)
	resp.Reset()
	resp.SetStatusCode(k.status)
	resp.Header.SetContentType("application/json")
	if k.status == fasthttp.StatusTooManyRequests || k.status == fasthttp.StatusServiceUnavailable {
		resp.Header.Set("Retry-After", strconv.Itoa(retryAfterSeconds(err)))
	}
	if k.status == fasthttp.StatusUnauthorized {
		resp.Header.Set("WWW-Authenticate", `Bearer realm="gpurouter"`) // RFC 6750 §3
	}
	resp.SetBody(appendErrorJSON(nil, err))
}
