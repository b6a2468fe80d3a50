package admission

import (
	"math"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// Cost is what admitting one request will take from its pool, in tokens,
// plus what the queue needs to order it. Build it with Estimator.Cost (or
// Controller.Estimate), which fills the token fields and remembers what is
// needed to learn from the engine's usage, then set Class, Tenant and
// Deadline. A Cost written by hand works too; it just teaches nothing.
type Cost struct {
	// PromptTokens is the prefill work: the prompt's estimated size after
	// the model's learned correction. Negative counts as 0.
	PromptTokens int
	// OutputTokens is the decode work: max_tokens when the client gave it,
	// else the model's learned expectation, capped by the model's length.
	OutputTokens int
	// Class is the priority class: larger is more urgent, and a queued
	// request of a larger class always goes before one of a smaller class.
	// Values outside [0, Config.Classes) are clamped into it; 0 (the zero
	// value) is the lowest class.
	Class int
	// Tenant groups requests for the per-tenant queue share and fairness
	// (an API key, a team). "" is a tenant like any other: every request
	// without one shares it.
	Tenant string
	// Deadline is when the request stops being worth serving (the
	// X-Gpurouter-Timeout header). The earlier of it and the context's
	// deadline applies; with neither, Config.DefaultTimeout after arrival;
	// else none. A request whose estimated wait exceeds it is refused at
	// once, and (with Config.ExpireQueued) one still queued when it passes is shed (ReasonExpired).
	// A context deadline that passes while queued ends Admit with the
	// context's error instead.
	Deadline time.Time
	// TPOT is the request's time-per-output-token objective (the
	// X-Gpurouter-Slo-Tpot header), 0 for none: a replica already
	// streaming slower than it (ReplicaLoad.ITL) has no room for the
	// request — it would miss there, and its prefill would stall every
	// decode there past the same objective.
	TPOT time.Duration

	// rawPrompt is the uncorrected prompt estimate Estimator.Cost started
	// from, 0 if none; an int32 so that it packs with the flags below
	// (a Cost lives in every request's exchange, proxy/size_test.go).
	rawPrompt   int32
	learnOutput bool // OutputTokens came from the learned distribution (no max_tokens)

	// ExpireAtDeadline makes Deadline a hard one for this request even
	// without Config.ExpireQueued: still queued when it passes, the request
	// is shed (ReasonExpired) — a deadline that comes from a latency
	// objective (the TTFT SLO header), after which serving it is wasted work
	// that would push requests that can still meet theirs past them.
	ExpireAtDeadline bool
	// cached is how much of the prompt a replica holds in its prefix
	// cache (SetCached), in units of cachedUnit tokens: a uint16 in the
	// padding after the flags above, so that Cost keeps its size.
	cached uint16
}

// cachedUnit is the granularity of Cost's cached prompt tokens: vLLM's
// default block size, the unit a prefix cache holds a prompt in.
const cachedUnit = 16

// SetCached records that a replica holds n of the prompt's tokens in its
// prefix cache where the request is bound to go (balancer: Pool.HeldPrefix),
// rounded down to cachedUnit. Admission then counts only the rest as its
// prefill — what it costs the replica's batch and KV, and what orders it
// in the queue — as the balancer does once it places the request there.
// Tokens still counts the whole prompt (rate limits, the lease's own
// accounting of what is cached on the replica it picks).
func (c *Cost) SetCached(n int) {
	c.cached = uint16(min(max(n, 0)/cachedUnit, math.MaxUint16))
}

// prefill is the prompt tokens admission counts: the prompt less what
// SetCached says is cached, at least 0.
func (c Cost) prefill() int {
	return max(c.PromptTokens-int(c.cached)*cachedUnit, 0)
}

// charge is the request's cost to its pool's admission: prefill plus
// decode, at least 1 (Tokens less the cached prompt).
func (c Cost) charge() int64 {
	return max(int64(c.prefill())+int64(max(c.OutputTokens, 0)), 1)
}

// Tokens is the request's total cost, prefill plus decode, at least 1 so
// that every request takes something from a budget.
func (c Cost) Tokens() int64 {
	return max(int64(max(c.PromptTokens, 0))+int64(max(c.OutputTokens, 0)), 1)
}

// Usage is what the engine reported for a finished request (its usage
// object). A zero field means "not reported"; it teaches nothing.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
}

// Ticket is an admitted request's hold on its pool's capacity, returned by
// Admit as a value so the fast path allocates nothing. Keep it in the
// request's state and call Release (or ReleaseUsage) exactly once, when the
// response stream closes; *Ticket satisfies interface{ Release() }.
//
// Release clears the ticket, so a second call on the same variable does
// nothing; a copy released separately would release twice, so don't copy
// a ticket you will release. The zero Ticket holds nothing and its Release
// does nothing. Release is not safe to call concurrently on one Ticket.
type Ticket struct {
	c      *Controller
	cost   Cost
	tokens int64 // charged tokens, as counted at admission
	waited time.Duration
	// longCap is the per-replica long-prefill cap the request must
	// respect when placed (SaturationConfig.LongPrefillCap); 0 for none.
	longCap int
	// unplaced: admitted from the queue and not yet Placed, so the queue
	// holds back the next admission until it is (see Config.MaxUnplaced).
	unplaced bool
}

// Placed tells the pool that the request is now counted by the balancer
// (a replica was picked and acquired for it), so the queue may admit the
// next request against capacity that includes this one. Call it right
// after the replica is acquired, not when the response starts. It is
// optional — Release implies it — but without it the queue drains only as
// fast as requests finish. Further calls do nothing.
func (t *Ticket) Placed() {
	if t.c == nil || !t.unplaced {
		return
	}
	t.unplaced = false
	t.c.placed()
}

// Release gives the ticket's tokens back to the pool, which may admit the
// next queued request at once.
func (t *Ticket) Release() { t.ReleaseUsage(Usage{}) }

// ReleaseUsage is Release, and also teaches the pool's Estimator the
// engine's real counts (the response's usage object), so later estimates
// for the model are corrected.
func (t *Ticket) ReleaseUsage(u Usage) {
	c := t.c
	if c == nil {
		return
	}
	t.c = nil
	c.release(t.tokens, t.unplaced)
	if u != (Usage{}) {
		c.est.Observe(t.cost, u)
	}
}

// Cost is the cost the ticket was admitted with.
func (t *Ticket) Cost() Cost { return t.cost }

// LongPrefillCap is the number of long prefills a replica may already be
// running for this request to be placed there (balancer.Request's
// LongPrefillCap): MaxLongPrefills for a long prompt, 0 (no cap) otherwise.
func (t *Ticket) LongPrefillCap() int { return t.longCap }

// Room is the pool's per-replica admission rule for placing the request
// (balancer.Request.Room): nil for the zero Ticket and for a controller
// judging by a Capacity of its own rather than its pool's loads.
func (t *Ticket) Room() balancer.Room {
	if t.c == nil || t.c.room == nil {
		return nil
	}
	return t.c.room
}

// Waited is how long the request waited in the queue (0 if admitted at once).
func (t *Ticket) Waited() time.Duration { return t.waited }

// Admitted reports whether the ticket holds capacity (it came from a
// successful Admit and has not been released).
func (t *Ticket) Admitted() bool { return t.c != nil }
