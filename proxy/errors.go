package proxy

import (
	"errors"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/valyala/fasthttp"
)

// Sentinel errors of the request path. Every error that reaches a client is
// mapped to an HTTP status and an OpenAI error body in exactly one place,
// errorTable below; code elsewhere returns these (wrapped with detail).
var (
	ErrBadRequest       = errors.New("bad request")
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

	// Client authentication (KeyStore): no or an unknown API key, a model
	// the key may not use, a key over its rate limit (the error carries
	// RetryAfter).
	ErrUnauthorized = errors.New("unauthorized")
	ErrForbidden    = errors.New("forbidden")
	ErrRateLimited  = errors.New("rate limit exceeded")
)

// errorKind is how one sentinel looks to a client.
type errorKind struct {
	err    error
	status int
	typ    string // OpenAI error "type"
	code   string // OpenAI error "code"
}

// errorTable maps sentinels to statuses; the first match (errors.Is) wins.
// Anything not listed is a 500.
var errorTable = [...]errorKind{
	{ErrBadRequest, fasthttp.StatusBadRequest, "invalid_request_error", "invalid_request"},
	{ErrUnknownModel, fasthttp.StatusNotFound, "invalid_request_error", "model_not_found"},
	{ErrNotFound, fasthttp.StatusNotFound, "invalid_request_error", "not_found"},
	{ErrUnauthorized, fasthttp.StatusUnauthorized, "invalid_request_error", "invalid_api_key"},
	{ErrForbidden, fasthttp.StatusForbidden, "invalid_request_error", "model_not_allowed"},
	{ErrRateLimited, fasthttp.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded"},
	{ErrMethodNotAllowed, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed"},
	{ErrBodyTooLarge, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large"},
	{ErrHeaderTooLarge, fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "request_header_too_large"},
	{ErrRequestTimeout, fasthttp.StatusRequestTimeout, "invalid_request_error", "request_timeout"},
	{ErrShed, fasthttp.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded"},
	{admission.ErrDeadline, fasthttp.StatusTooManyRequests, "rate_limit_error", "deadline_unreachable"},
	{admission.ErrShed, fasthttp.StatusTooManyRequests, "rate_limit_error", "queue_full"},
	{ErrNoReplica, fasthttp.StatusServiceUnavailable, "server_error", "no_healthy_replica"},
	{ErrShuttingDown, fasthttp.StatusServiceUnavailable, "server_error", "shutting_down"},
	{ErrTimeout, fasthttp.StatusGatewayTimeout, "server_error", "upstream_timeout"},
	{ErrUpstream, fasthttp.StatusBadGateway, "server_error", "bad_upstream"},
	{ErrClientGone, 499, "invalid_request_error", "client_closed_request"},
}

func classify(err error) errorKind {
	for _, k := range errorTable {
		if errors.Is(err, k.err) {
			return k
		}
	}
	return errorKind{err: err, status: fasthttp.StatusInternalServerError, typ: "server_error", code: "internal_error"}
}

// statusOf is the HTTP status an error maps to.
func statusOf(err error) int { return classify(err).status }

// paramError is a bad-request error that names the offending field, so the
// OpenAI body's "param" says which one.
type paramError struct {
	param string
	msg   string
}

func (e *paramError) Error() string { return e.param + ": " + e.msg }
func (e *paramError) Unwrap() error { return ErrBadRequest }

func badParam(param, msg string) error { return &paramError{param: param, msg: msg} }

// appendErrorJSON appends {"error":{"message","type","param","code"}} for err.
func appendErrorJSON(dst []byte, err error) []byte {
	k := classify(err)
	var param string
	var pe *paramError
	if errors.As(err, &pe) {
		param = pe.param
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
func writeError(ctx *fasthttp.RequestCtx, err error) {
	k := classify(err)
	ctx.Response.Reset()
	ctx.SetStatusCode(k.status)
	ctx.SetContentType("application/json")
	if k.status == fasthttp.StatusTooManyRequests || k.status == fasthttp.StatusServiceUnavailable {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(retryAfterSeconds(err)))
	}
	if k.status == fasthttp.StatusUnauthorized {
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="gpurouter"`) // RFC 6750 §3
	}
	ctx.SetBody(appendErrorJSON(nil, err))
}
