package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/fasthttp"
)

// How a replica failed a request, in words a client can act on. The
// client never sees a library's message (a fasthttp hint about
// "connection: close" headers means nothing to an SDK user); the access
// log keeps it as the failure's cause.

// upstreamFailure is a replica failing a request before answering: kind is
// the sentinel that decides the status (ErrUpstream, ErrTimeout,
// ErrNoReplica), words say what happened, cause is the library's error.
type upstreamFailure struct {
	kind  error
	words string
	cause error
}

func (e *upstreamFailure) Error() string { return e.kind.Error() + ": " + e.words }
func (e *upstreamFailure) Unwrap() error { return e.kind }

// Cause is the underlying error, for the log.
func (e *upstreamFailure) Cause() error { return e.cause }

// errUnreachable marks a replica that refused the connection: nothing
// listens there, so the request was never processed and another replica
// may take it at no risk.
var errUnreachable = fmt.Errorf("%w: replica unreachable", ErrNoReplica)

// upstreamError describes err, which ended a request to rep before any
// response byte arrived.
func upstreamError(rep *balancer.Replica, err error) error {
	f := &upstreamFailure{kind: ErrUpstream, cause: err}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		f.kind, f.words = errUnreachable, "replica "+rep.Name()+" refused the connection"
	case errors.Is(err, fasthttp.ErrNoFreeConns), errors.Is(err, fasthttp.ErrConnPoolStrategyNotImpl):
		f.words = "replica " + rep.Name() + " has no free connection (upstream.max_conns_per_replica)"
	case isDialError(err) && isTimeout(err):
		f.kind, f.words = ErrTimeout, "replica "+rep.Name()+" could not be reached in time"
	case isTimeout(err):
		f.kind, f.words = ErrTimeout, "replica "+rep.Name()+" sent no response in time"
	case isDialError(err):
		f.kind, f.words = errUnreachable, "replica "+rep.Name()+" could not be reached"
	case peerClosedErr(err):
		f.words = "replica " + rep.Name() + " closed the connection before answering"
	default:
		f.words = "replica " + rep.Name() + " failed before answering"
	}
	return f
}

// isDialError reports whether err happened while connecting.
func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// peerClosedErr reports an error that means the other end closed or reset
// the connection.
func peerClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, fasthttp.ErrConnectionClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, net.ErrClosed)
}

// streamWords says in plain words why a stream's body read failed.
func streamWords(err error) string {
	if peerClosedErr(err) {
		return "the replica closed the connection"
	}
	return "the connection to the replica failed"
}

// refusal is an engine declining a request for lack of room (429, or 503
// with its queue full) before working on it. It is nobody's failure: the
// replica rests for retryAfter and the request may go elsewhere; when no
// replica has room the client gets the refusal, status and Retry-After
// kept, so an SDK backs off as it would against the engine itself.
type refusal struct {
	replica    string // "" when every replica of the pool is resting
	model      string
	status     int // 429 or 503
	retryAfter time.Duration
}

// Sentinels of refusals, one per status the client gets.
var (
	ErrOverloaded  = errors.New("engine overloaded")
	ErrUnavailable = errors.New("engine unavailable")
)

func (e *refusal) Error() string {
	secs := strconv.Itoa(int((e.retryAfter + time.Second - 1) / time.Second))
	if e.replica == "" {
		return fmt.Sprintf("every replica of model %q is refusing requests (its queue is full); retry after %s s", e.model, secs)
	}
	return fmt.Sprintf("replica %s refused the request (%d: its queue is full) and no other replica of model %q has room; retry after %s s", e.replica, e.status, e.model, secs)
}

func (e *refusal) Unwrap() error {
	if e.status == fasthttp.StatusServiceUnavailable {
		return ErrUnavailable
	}
	return ErrOverloaded
}

// RetryAfter is how long the client should wait (Retry-After).
func (e *refusal) RetryAfter() time.Duration { return e.retryAfter }

// defaultRetryAfter is the rest a refusal without Retry-After earns.
const defaultRetryAfter = time.Second

// retryAfterOf reads a response's Retry-After (seconds or an HTTP date),
// bounded to [1 s, balancer.MaxRest]; defaultRetryAfter when absent or
// unreadable.
// peekFold is a response header's value by its name in any case. The
// upstream client keeps header names as the engine wrote them
// (DisableHeaderNamesNormalizing), where Peek matches them exactly, and
// uvicorn, vLLM's server, writes them in lower case.
func peekFold(h *fasthttp.ResponseHeader, name string) []byte {
	for k, v := range h.All() {
		if len(k) == len(name) && bytes.EqualFold(k, []byte(name)) {
			return v
		}
	}
	return nil
}

func retryAfterOf(resp *fasthttp.Response, now time.Time) time.Duration {
	v := peekFold(&resp.Header, "Retry-After")
	d := defaultRetryAfter
	if len(v) > 0 {
		if n, err := strconv.Atoi(string(v)); err == nil {
			d = time.Duration(n) * time.Second
		} else if t, err := fasthttp.ParseHTTPDate(v); err == nil {
			d = t.Sub(now)
		}
	}
	return min(max(d, time.Second), balancer.MaxRest)
}
