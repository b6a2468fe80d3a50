package proxy

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/fasthttp"
)

// Request headers that steer admission.
const (
	headerPriority = "X-Gpurouter-Priority" // integer class, larger is more urgent; at most the API key's tier
	headerTenant   = "X-Gpurouter-Tenant"   // fairness group, else the body's user; ignored with an API key (the key is the tenant)
	headerTimeout  = "X-Gpurouter-Timeout"  // "5s" or seconds: refuse at once if the wait would exceed it
)

// steer completes the request's cost for admission from its headers: its
// priority class (at most its API key's tier), its tenant (its key, else
// the header, else the body's user), its deadline and its TPOT objective.
// Pools without admission ignore them.
func (s *Server) steer(hdr *clientHeaders, x *exchange) error {
	if x.route.Admission == nil {
		return nil
	}
	if v := hdr.priority; len(v) > 0 {
		class, err := strconv.Atoi(string(v))
		if err != nil {
			return openai.BadParam(headerPriority, "must be an integer priority class")
		}
		if x.keys != nil {
			class = min(class, x.cost.Class) // a key's tier is its ceiling
		}
		x.cost.Class = class
	}
	if x.keys == nil { // an authenticated client is its key's tenant
		x.cost.Tenant = string(hdr.tenant)
		if x.cost.Tenant == "" {
			x.cost.Tenant = x.req.User
		}
	}
	if v := hdr.timeout; len(v) > 0 {
		d, err := parseTimeout(string(v))
		if err != nil {
			return openai.BadParam(headerTimeout, err.Error())
		}
		x.cost.Deadline = x.received.Add(d)
	}
	// A TTFT objective is a deadline too: a request still waiting at the
	// router when it passes can no longer meet it, and serving it anyway
	// would only push others past theirs; shed it then (at once when not
	// even an idle replica could prefill it in time).
	if v := hdr.sloTTFT; len(v) > 0 {
		d, err := parseTimeout(string(v))
		if err != nil {
			return openai.BadParam(headerSLOTTFT, err.Error())
		}
		// Admitted after received + SLO − its own prefill, the request
		// cannot meet the SLO on any replica: its prefill where that is
		// shortest, on the replica holding most of its prompt cached.
		d -= x.route.Pool.PrefillTimeCached(x.cost.PromptTokens, x.prompt.prefixKeysOf(), x.received)
		if dl := x.received.Add(d); x.cost.Deadline.IsZero() || dl.Before(x.cost.Deadline) {
			x.cost.Deadline = dl
		}
		x.cost.ExpireAtDeadline = true
	}
	if v := hdr.sloTPOT; len(v) > 0 {
		d, err := parseTimeout(string(v))
		if err != nil {
			return openai.BadParam(headerSLOTPOT, err.Error())
		}
		x.cost.TPOT = d
	}
	return nil
}

// admitWatched is actAdmit on the goroutine path: the request waits in
// its pool's queue until a replica can take it, it is shed, or the client
// leaves (found by the same socket watch as a stream's).
func (s *Server) admitWatched(ctx *fasthttp.RequestCtx, x *exchange) error {
	actx, cancel := context.WithCancelCause(s.base)
	defer cancel(nil)
	w := s.startWatch(x, ctx.Conn(), abortFunc(cancel))
	err := s.admitWait(actx, x)
	w.stop()
	return err
}

// admitNow decides what can be decided without waiting: wait is true
// when the request must queue (admitWait), else err is the decision.
func (s *Server) admitNow(x *exchange) (wait bool, err error) {
	ctl := x.route.Admission
	if ctl == nil {
		return false, nil
	}
	// With no replica up the pool can't serve it however long it waits:
	// 503 now, as without admission, not a queue until one comes back.
	if x.route.Pool.Available(x.received) == 0 {
		return false, fmt.Errorf("%w for model %q", ErrNoReplica, x.route.Pool.Model())
	}
	// A pool with room admits at once: what only a wait needs — a
	// cancelable context, a watch on the client — is not made.
	if t, ok := ctl.TryAdmit(x.cost); ok {
		x.admitted = s.now()
		x.ticket = t
		return false, nil
	}
	// No room for the whole prompt. Where a replica holds most of it in
	// its prefix cache, the request costs that replica only the rest:
	// judged (and queued) by that, it goes there before its history is
	// evicted. Only here, where it would wait: the lookup is not paid by
	// a request the pool has room for.
	if held := x.route.Pool.HeldPrefix(x.cost.PromptTokens, x.prompt.prefixKeysOf(), x.received); held > 0 {
		x.cost.SetCached(held)
		if t, ok := ctl.TryAdmit(x.cost); ok {
			x.admitted = s.now()
			x.ticket = t
			return false, nil
		}
	}
	return true, nil
}

// admitWait queues the request until it is admitted or shed, or actx
// ends (its cause is the error: the client left, the router shuts down).
func (s *Server) admitWait(actx context.Context, x *exchange) error {
	t, err := x.route.Admission.Admit(actx, x.cost)
	x.admitted = s.now()
	if err != nil {
		if actx.Err() != nil {
			return context.Cause(actx)
		}
		return err
	}
	x.ticket = t
	return nil
}

// parseTimeout reads a Go duration ("2.5s", "800ms") or plain seconds.
func parseTimeout(v string) (time.Duration, error) {
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, nil
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && f > 0 {
		return time.Duration(f * float64(time.Second)), nil
	}
	return 0, fmt.Errorf("must be a positive duration (\"5s\") or seconds, got %q", v)
}

// releaseTicket gives the admission slot back with the engine's usage, so
// the estimator learns (once, when the request ends). Without a ticket it
// does nothing.
func (x *exchange) releaseTicket() {
	if x.gotUsage {
		x.ticket.ReleaseUsage(admission.Usage{PromptTokens: int(x.promptTokens), CompletionTokens: int(x.completionTokens)})
		return
	}
	x.ticket.Release()
}
