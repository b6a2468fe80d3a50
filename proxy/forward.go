package proxy

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// retryable reports an upstream status that says "not now, try elsewhere"
// before the engine started on the request: a 502 from a proxy in front of
// the engine. (429 and 503 are refusals: see judge.)
func retryable(status int) bool { return status == fasthttp.StatusBadGateway }

// pickRequest is what the picker reads about the request.
func (x *exchange) pickRequest() balancer.Request {
	r := balancer.Request{
		AffinityKey: x.affinity,
		PrefixHash:  x.req.PrefixHash,
		Prefix:      x.prompt.prefixKeysOf(),
		ArmKey:      x.id,
		Arm:         x.arm,
		// When it is placed, not when it arrived: a request that waited
		// in the admission queue must be judged by the replicas' state now.
		Now:   x.received,
		Model: x.req.Model,
		// A long prompt must not queue behind another on one replica.
		LongPrefillCap: x.ticket.LongPrefillCap(),
		PromptTokens:   x.cost.PromptTokens,
		OutputTokens:   x.cost.OutputTokens,
		Room:           x.ticket.Room(),
	}
	if !x.admitted.IsZero() {
		r.Now = x.admitted
	}
	if x.req.User != "" {
		r.ArmKey = x.req.User // a user stays in one arm across requests
	}
	return r
}

// noReplica is the error for a request that found no replica to try:
// why the last one tried failed — said of the whole pool when every
// replica is unreachable — else that every replica is resting after
// refusals, else that none is available.
func (x *exchange) noReplica(lastErr error) error {
	p := x.route.Pool
	now := x.s.now()
	switch {
	case errors.Is(lastErr, errUnreachable) && p.Available(now) == 0:
		return fmt.Errorf("%w: every replica of model %q is unreachable (last: %s)", ErrNoReplica, p.Model(), lastErr.(*upstreamFailure).words)
	case lastErr != nil:
		return lastErr
	}
	if until, ok := p.RestEnds(now); ok {
		return &refusal{model: p.Model(), status: fasthttp.StatusTooManyRequests, retryAfter: until.Sub(now)}
	}
	return fmt.Errorf("%w for model %q", ErrNoReplica, p.Model())
}

// retryDelay is the pause before the next try, after n attempts: none
// while none has gone out, full-jitter backoff after one; or the error
// that ends the request, the attempts used up.
func (s *Server) retryDelay(n int, x *exchange, lastErr error) (time.Duration, error) {
	if n >= s.cfg.MaxAttempts {
		return 0, x.noReplica(lastErr)
	}
	if n > 0 {
		return s.backoff(n), nil
	}
	return 0, nil
}

// beginAttempt is an attempt's start on rep: its upstream, and a lease
// with the request's cost. A nil upstream means rep can't take it, with
// the reason (nil when nothing stands against another replica): not an
// attempt, as nothing was sent.
func (s *Server) beginAttempt(rt *routeTable, x *exchange, rep *balancer.Replica, pick *balancer.Request) (*upstream, balancer.Lease, error) {
	up := s.upstreamOf(rt, rep)
	if up == nil {
		// A reload put the replica in its pool and has not yet published
		// the table that connects to it: not routable yet.
		return nil, balancer.Lease{}, nil
	}
	// The prompt tokens rep holds in its prefix cache are neither prefill
	// work nor new KV: the lease counts the rest.
	if x.prompt != nil {
		x.prompt.cached = pick.CachedTokens(rep)
	}
	work, kv, long := x.leaseCost()
	lease, err := rep.AcquireRequest(balancer.LeaseCost{Work: work, KV: kv, Long: long,
		PromptTokens: int64(x.leasePrompt()), CachedTokens: int64(x.prompt.cachedTokens()), MostCached: int64(pick.MostCachedTokens()), Prefix: pick.Prefix,
		OutputTokens: int64(max(x.cost.OutputTokens, 0)), TPOTObjective: x.cost.TPOT, Adapter: x.route.Pool.AdapterOf(x.req.Model)})
	if err != nil {
		// An open breaker: nothing was sent.
		return nil, balancer.Lease{}, fmt.Errorf("%w for model %q (breakers open)", ErrNoReplica, x.route.Pool.Model())
	}
	x.attempts++
	x.last = rep
	x.ticket.Placed()
	return up, lease, nil
}

// abandon ends the lease of an attempt given up for cause — the client
// left, the deadline passed, the router shuts down: only a timeout is the
// replica's fault.
func abandon(lease balancer.Lease, cause error) {
	if errors.Is(cause, ErrTimeout) {
		lease.Done(cause)
		return
	}
	lease.Done(errors.Join(cause, balancer.ErrNotReplicaFault))
}

// attemptFailed judges err, which ended the attempt on rep before any
// response byte: the error to try another replica with.
func (s *Server) attemptFailed(x *exchange, rep *balancer.Replica, lease balancer.Lease, err error) error {
	err = upstreamError(rep, err)
	if errors.Is(err, errUnreachable) {
		// Nothing listens there: the request was never processed, so
		// it is no attempt, and the replica is down until the health
		// checker sees it again — not a breaker failure, a fact.
		x.attempts--
		lease.Done(balancer.ErrNotReplicaFault)
		if rep.MarkDown() {
			s.log.Warn("replica unreachable: out of rotation until its health check passes",
				zap.String("replica", rep.Name()), zap.Error(err.(*upstreamFailure).cause))
		}
	} else {
		lease.Done(err)
	}
	s.m.retries.WithLabelValues(x.route.Pool.Model(), retryReason(err)).Inc()
	return err
}

// judge reads the status of rep's response, after n attempts: nil when
// it is the answer to relay, else the reason to try another replica (the
// lease is then done, the caller closes the response).
func (s *Server) judge(n int, x *exchange, rep *balancer.Replica, lease balancer.Lease, resp *fasthttp.Response) error {
	status := resp.StatusCode()
	if passesOnStatus(status) {
		return nil
	}
	if status == fasthttp.StatusTooManyRequests || status == fasthttp.StatusServiceUnavailable {
		// The engine has no room (its queue is full): it rests for its
		// Retry-After and the request goes to a replica that has room, or
		// back to the client as the same refusal. Not the breaker's
		// business: the replica is working, just full.
		now := s.now()
		ra := retryAfterOf(resp, now)
		rep.Rest(now, now.Add(ra))
		lease.Done(balancer.ErrNotReplicaFault)
		s.m.retries.WithLabelValues(x.route.Pool.Model(), strconv.Itoa(status)).Inc()
		return &refusal{replica: rep.Name(), model: x.route.Pool.Model(), status: status, retryAfter: ra}
	}
	if retryable(status) && n < s.cfg.MaxAttempts {
		lease.Done(fmt.Errorf("upstream status %d", status))
		s.m.retries.WithLabelValues(x.route.Pool.Model(), strconv.Itoa(status)).Inc()
		return fmt.Errorf("%w: replica %s answered %d", ErrUpstream, rep.Name(), status)
	}
	return nil
}

// passesOnStatus reports whether judge passes an answer of this status
// whatever else it holds: a request loop relays those without the
// Response judge reads (reqloop_answer_linux.go).
func passesOnStatus(status int) bool {
	return status != fasthttp.StatusTooManyRequests && status != fasthttp.StatusServiceUnavailable && !retryable(status)
}

// answered makes the exchange the holder of the attempt that answered:
// its replica's metrics and lease, and the time its head came.
func (x *exchange) answered(up *upstream, lease balancer.Lease) {
	x.up, x.rm, x.lease, x.firstByte = up, up.metricsFor(x.arm), lease, x.s.now()
}

// upstreamOf is rep's upstream: from rt, the table the request was routed
// with, or for a replica added to its pool since, from the current table.
// Pools are updated in place on reload, so a request can pick a replica
// newer than its table; nil until the table that has it is published.
func (s *Server) upstreamOf(rt *routeTable, rep *balancer.Replica) *upstream {
	if u, ok := rt.upstream(rep); ok {
		return u
	}
	u, _ := s.routes.Load().upstream(rep)
	return u
}

func retryReason(err error) string {
	if errors.Is(err, ErrTimeout) {
		return "timeout"
	}
	return "connect"
}

// backoff is full-jitter exponential: uniform in [0, min(max, base·2^n)).
func (s *Server) backoff(attempt int) time.Duration {
	d := s.cfg.BackoffBase << (attempt - 1)
	if d > s.cfg.BackoffMax || d <= 0 {
		d = s.cfg.BackoffMax
	}
	return time.Duration(s.jitter(int64(d)) + 1)
}
