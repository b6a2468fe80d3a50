package proxy

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/valyala/fasthttp"
)

// PoolAdmission is one pool's admission control: the controller that
// queues requests while the pool is saturated, and the capacity answer it
// asks (also used to keep long prompts off replicas at their cap).
type PoolAdmission struct {
	Controller *admission.Controller
	Capacity   *PoolCapacity
}

// Request headers that steer admission.
const (
	headerPriority = "X-Gpurouter-Priority" // integer class, larger is more urgent; at most the API key's tier
	headerTenant   = "X-Gpurouter-Tenant"   // fairness group, else the body's user; ignored with an API key (the key is the tenant)
	headerTimeout  = "X-Gpurouter-Timeout"  // "5s" or seconds: refuse at once if the wait would exceed it
)

// admit holds the request in the pool's queue until a replica can take it,
// it is shed, or the client leaves (found by the same socket watch as a
// stream). On success the exchange holds the ticket and its cost.
func (s *Server) admit(ctx *fasthttp.RequestCtx, x *exchange, pa PoolAdmission) error {
	cost := pa.Controller.Estimate(x.req.promptTokens(), x.req.maxTokens)
	x.estPrompt = cost.PromptTokens
	if v := ctx.Request.Header.Peek(headerPriority); len(v) > 0 {
		class, err := strconv.Atoi(string(v))
		if err != nil {
			return badParam(headerPriority, "must be an integer priority class")
		}
		cost.Class = class
		if x.keys != nil {
			cost.Class = min(class, x.class) // a key's tier is its ceiling
		}
	} else {
		cost.Class = x.class
	}
	cost.Tenant = string(ctx.Request.Header.Peek(headerTenant))
	if cost.Tenant == "" || x.keys != nil {
		cost.Tenant = x.tenant // an authenticated client is its key's tenant
	}
	if v := ctx.Request.Header.Peek(headerTimeout); len(v) > 0 {
		d, err := parseTimeout(string(v))
		if err != nil {
			return badParam(headerTimeout, err.Error())
		}
		cost.Deadline = x.received.Add(d)
	}

	actx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	w := s.startWatch(x, ctx.Conn(), cancel)
	t, err := pa.Controller.Admit(actx, cost)
	w.stop()
	x.admitted = s.now()
	if err != nil {
		if actx.Err() != nil {
			return context.Cause(actx) // the client left, or the router is shutting down
		}
		return err
	}
	x.ticket = t
	x.hasTicket = true
	x.longCap = pa.Capacity.longPrefillCap(cost)
	x.kvCost = cost.Tokens()
	x.prefillCost = s.score.Cost(cost.PromptTokens, 0)
	x.outputCost = int64(max(cost.OutputTokens, 0))
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
// the estimator learns (once, when the request ends).
func (x *exchange) releaseTicket() {
	if !x.hasTicket {
		return
	}
	x.hasTicket = false
	if x.gotUsage {
		x.ticket.ReleaseUsage(admission.Usage{PromptTokens: x.promptTokens, CompletionTokens: x.completionTokens})
		return
	}
	x.ticket.Release()
}
