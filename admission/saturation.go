package admission

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// Defaults for SaturationConfig's zero fields.
const (
	DefaultKVUsageThreshold = 0.9
	DefaultTokenBudgetRatio = 1.0
	DefaultLongPrefillTime  = time.Second
	DefaultMaxLongPrefills  = 1
	DefaultShortLanes       = 1
	DefaultMaxPrefillWait   = time.Second
	DefaultMaxITLShare      = 0.85
)

// Capacity is the one question the Controller asks of its pool: could some
// replica take a request of this cost now without it queueing inside an
// engine? With Deps.Pool the controller answers it itself, applying
// SaturationConfig.Admissible to the pool's load snapshot; a Capacity of
// one's own replaces that rule (tests, other schedulers).
//
// Admissible is called with the controller's lock held, on every admission
// attempt: it must be fast, must not block or allocate, and must not call
// back into the Controller.
type Capacity interface {
	Admissible(c Cost) bool
}

// CapacityFunc adapts a function to Capacity.
type CapacityFunc func(c Cost) bool

// Admissible calls f(c).
func (f CapacityFunc) Admissible(c Cost) bool { return f(c) }

// ReplicaLoad is what the saturation rule reads about one replica: the
// balancer's snapshot (Pool.Loads), staleness already judged there.
type ReplicaLoad = balancer.ReplicaLoad

// SaturationConfig holds the thresholds of the saturation rule. The zero
// value means every default; each field says what zero and negative mean.
type SaturationConfig struct {
	// MaxWaiting is how many requests may sit in an engine's waiting queue
	// before the replica is saturated — a queue its last two reports both
	// showed (ReplicaLoad.Waiting), not requests waiting for its next step.
	// 0 (the default) means any such waiting request saturates it;
	// negative ignores the waiting queue.
	MaxWaiting int
	// KVUsageThreshold is the KV-cache usage, 0–1, at or above which a
	// replica whose KV capacity is unknown is saturated (default 0.9).
	// Where the capacity is known (vllm:cache_config_info) the rule is the
	// engine's own: a request has room while its prefill (the prompt less
	// what the replica holds cached) fits in the free KV above vLLM's
	// watermark (kvWatermark), as vLLM then schedules it at once. At 90%
	// a replica still has tens of thousands of tokens free on an H100
	// and several short prompts' worth on an A10: held at that line, a
	// short-prompt trace waited at the router while the engines would
	// have started it (conv85 without SLO headers: P50 TTFT 0.48 s, 0.30 s
	// with admission off). Negative ignores KV usage.
	KVUsageThreshold float64
	// TokenBudgetRatio sizes the router-side token budget as a multiple of
	// the replica's KV capacity (default 1.0): the most KV the router's
	// requests there will hold at once (ReplicaLoad.OutstandingTokens,
	// balancer/kvpeak.go) plus the request's whole footprint must stay
	// within it (a replica holding nothing takes any request). Negative
	// means no budget; no budget applies either while the capacity is
	// unknown.
	TokenBudgetRatio float64
	// LongPrefillTime is how long a prompt's prefill must take, at the
	// pool's fastest learned prefill rate, for the request to be a long
	// prefill (default 1s), capped per replica by MaxLongPrefills and kept
	// off the ShortLanes. What a long prompt costs the requests behind it
	// is the time it holds the engine's prefill, so the line is drawn in
	// time: a 4,096-token prompt takes a second on an A10 and a seventh of
	// one on an H100, where counting it long held requests at the router
	// while every engine had room (two thirds of a production trace's
	// prompts are over 4,096 tokens).
	LongPrefillTime time.Duration
	// LongPrefillTokens, when positive, draws the line in prompt tokens
	// instead, whatever the replicas' speed. 0 (the default) means
	// LongPrefillTime; negative disables the lane cap and short lanes.
	LongPrefillTokens int
	// MaxLongPrefills caps concurrent long prefills per replica (default 1),
	// so short requests always find a replica not stuck behind one.
	// Negative means no cap.
	MaxLongPrefills int
	// ShortLanes is how many of a pool's available replicas are kept free
	// of long prefills (default 1): a long request waits at the router
	// rather than take the last replica a short request could start on at
	// once. Negative means none kept. Applied by Admissible, over the pool.
	ShortLanes int
	// MaxPrefillWait is how much prefill may be queued on a replica, in
	// time at its learned prefill rate (ReplicaLoad.PrefillWait), before it
	// is saturated (default 1s): enough to keep the engine busy until the
	// router sends the next, not so much that a burst waits in the engine's
	// first-come-first-served queue, where a short prompt sits behind long
	// ones and no deadline is looked at. Negative ignores it.
	MaxPrefillWait time.Duration
	// MaxITLShare is the share of a request's TPOT objective (Cost.TPOT) a
	// replica's live inter-token latency (ReplicaLoad.ITL) may reach
	// before the replica has no room for that request (default 0.85).
	// Below 1: the request decodes among the prefills of the requests
	// placed after it, so a replica filled right up to the objective
	// serves about half its requests over it. Negative ignores TPOT
	// objectives.
	MaxITLShare float64
}

// WithDefaults returns s with every zero field set to its default.
func (s SaturationConfig) WithDefaults() SaturationConfig {
	if s.KVUsageThreshold == 0 {
		s.KVUsageThreshold = DefaultKVUsageThreshold
	}
	if s.TokenBudgetRatio == 0 {
		s.TokenBudgetRatio = DefaultTokenBudgetRatio
	}
	if s.LongPrefillTime <= 0 {
		s.LongPrefillTime = DefaultLongPrefillTime
	}
	if s.MaxLongPrefills == 0 {
		s.MaxLongPrefills = DefaultMaxLongPrefills
	}
	if s.ShortLanes == 0 {
		s.ShortLanes = DefaultShortLanes
	}
	if s.MaxPrefillWait == 0 {
		s.MaxPrefillWait = DefaultMaxPrefillWait
	}
	if s.MaxITLShare == 0 {
		s.MaxITLShare = DefaultMaxITLShare
	}
	return s
}

// Validate reports every invalid field.
func (s SaturationConfig) Validate() error {
	var errs []error
	if math.IsNaN(s.KVUsageThreshold) || s.KVUsageThreshold > 1 {
		errs = append(errs, fmt.Errorf("admission: Saturation.KVUsageThreshold = %v: must be ≤ 1 (negative to ignore KV usage)", s.KVUsageThreshold))
	}
	if math.IsNaN(s.TokenBudgetRatio) || math.IsInf(s.TokenBudgetRatio, 0) {
		errs = append(errs, fmt.Errorf("admission: Saturation.TokenBudgetRatio = %v: must be finite", s.TokenBudgetRatio))
	}
	if math.IsNaN(s.MaxITLShare) || math.IsInf(s.MaxITLShare, 0) {
		errs = append(errs, fmt.Errorf("admission: Saturation.MaxITLShare = %v: must be finite (negative to ignore TPOT objectives)", s.MaxITLShare))
	}
	return errors.Join(errs...)
}

// TokenBudget is the replica's router-side token budget: TokenBudgetRatio ×
// KV capacity, 0 when there is none (unknown capacity, or disabled).
func (s SaturationConfig) TokenBudget(kvCapacityTokens int64) int64 {
	s = s.WithDefaults()
	if kvCapacityTokens <= 0 || s.TokenBudgetRatio < 0 {
		return 0
	}
	return int64(s.TokenBudgetRatio * float64(kvCapacityTokens))
}

// Saturated reports whether the replica can take no request at all without
// queueing inside the engine: telemetry stale, resting after a refusal,
// requests waiting beyond MaxWaiting, KV usage at the threshold, prefill
// queued for MaxPrefillWait or more, or the token budget used up.
func (s SaturationConfig) Saturated(r ReplicaLoad) bool {
	return s.saturation(r) != HoldNone
}

// saturation is Saturated's reason, HoldNone when there is none.
func (s SaturationConfig) saturation(r ReplicaLoad) Hold {
	s = s.WithDefaults()
	switch {
	case r.Stale:
		return HoldStale
	case r.Resting:
		return HoldResting
	case s.MaxWaiting >= 0 && r.Waiting > s.MaxWaiting:
		return HoldWaiting
	case s.KVUsageThreshold >= 0 && r.KVCapacityTokens <= 0 && r.KVUsage >= s.KVUsageThreshold,
		s.KVUsageThreshold >= 0 && r.KVCapacityTokens > 0 && r.KVUsage >= 1-kvWatermark:
		return HoldKVUsage
	case s.MaxPrefillWait > 0 && r.PrefillWait >= s.MaxPrefillWait:
		return HoldPrefillWait
	}
	if b := s.TokenBudget(r.KVCapacityTokens); b > 0 && r.OutstandingTokens >= b {
		return HoldTokenBudget
	}
	return HoldNone
}

// Fits reports whether the replica can take a request of cost c now: it is
// not saturated, c fits in its token budget, the replica streams faster
// than MaxITLShare of c's TPOT objective (when it has one), c's prefill
// there would not stall a request decoding there past its own TPOT
// objective (its decode headroom, ReplicaLoad.Headroom), and if c is a
// long prefill the replica has a long-prefill lane free. The balancer's
// Capacity answer is "some available replica Fits".
func (s SaturationConfig) Fits(r ReplicaLoad, c Cost) bool {
	return s.HoldOn(r, c) == HoldNone
}

// HoldOn is the first of Fits's rules that leaves the replica no room for
// c, HoldNone when it fits; c's long-prefill class at the replica's own
// learned rate.
func (s SaturationConfig) HoldOn(r ReplicaLoad, c Cost) Hold {
	return s.holdOn(r, c, s.LongPrefill(c, r.PrefillPerToken))
}

// holdOn is HoldOn with c's long-prefill class decided by the caller:
// the pool's, at its fastest replica's rate (poolCapacity), or none where
// the balancer applies the cap itself (roomRule).
func (s SaturationConfig) holdOn(r ReplicaLoad, c Cost, long bool) Hold {
	s = s.WithDefaults()
	if h := s.saturation(r); h != HoldNone {
		return h
	}
	if s.KVUsageThreshold >= 0 && r.KVCapacityTokens > 0 && r.KVUsage > 0 &&
		float64(c.prefill()) > (1-kvWatermark-r.KVUsage)*float64(r.KVCapacityTokens) {
		return HoldKVUsage // its prompt does not fit in what the engine has free (an empty one takes any)
	}
	if b := s.TokenBudget(r.KVCapacityTokens); b > 0 && r.OutstandingTokens > 0 && r.OutstandingTokens+c.charge() > b {
		return HoldTokenBudget
	}
	if c.TPOT > 0 && s.MaxITLShare > 0 && r.ITL > 0 && float64(r.ITL) >= s.MaxITLShare*float64(c.TPOT) {
		return HoldITL
	}
	if n := c.prefill(); r.HeadroomKnown && n > 0 && time.Duration(n)*r.PrefillPerToken > r.Headroom {
		return HoldHeadroom // its prefill would stall a request decoding there past its TPOT objective
	}
	if long && s.MaxLongPrefills >= 0 && r.LongPrefills >= s.MaxLongPrefills {
		return HoldLongPrefill
	}
	return HoldNone
}

// LongPrefill reports whether c's prompt makes it a long prefill, counted
// against ReplicaLoad.LongPrefills while it is in prefill: its prefill
// (the prompt less what a replica holds cached, Cost.SetCached) at
// perToken a prompt token (the pool's fastest learned rate; 0 for
// none learned: balancer.DefaultPrefillSecondsPerToken) takes at least
// LongPrefillTime, or it has LongPrefillTokens when that is set.
func (s SaturationConfig) LongPrefill(c Cost, perToken time.Duration) bool {
	s = s.WithDefaults()
	switch {
	case s.LongPrefillTokens < 0:
		return false
	case s.LongPrefillTokens > 0:
		return c.prefill() >= s.LongPrefillTokens
	}
	if perToken <= 0 {
		perToken = defaultPrefillPerToken
	}
	n := c.prefill()
	return n > 0 && time.Duration(n)*perToken >= s.LongPrefillTime
}

// kvWatermark is the share of its KV cache vLLM keeps free when it
// schedules a waiting request (the scheduler's watermark, 1% of the
// blocks): a prompt that would eat into it waits in the engine's queue.
const kvWatermark = 0.01

// defaultPrefillPerToken is the prefill time of a prompt token before any
// is learned: the balancer's default.
const defaultPrefillPerToken = time.Duration(balancer.DefaultPrefillSecondsPerToken * float64(time.Second))

// Level is the replica's saturation as one number for scoring and
// dashboards: the largest of waiting/(MaxWaiting+1), KV usage over its
// threshold and outstanding tokens over the budget, so ≥ 1 means
// saturated; stale telemetry is 1.
func (s SaturationConfig) Level(r ReplicaLoad) float64 {
	s = s.WithDefaults()
	if r.Stale || r.Resting {
		return 1
	}
	var l float64
	if s.MaxWaiting >= 0 {
		l = float64(r.Waiting) / float64(s.MaxWaiting+1)
	}
	switch {
	case s.KVUsageThreshold >= 0 && r.KVCapacityTokens > 0:
		l = max(l, r.KVUsage/(1-kvWatermark))
	case s.KVUsageThreshold > 0:
		l = max(l, r.KVUsage/s.KVUsageThreshold)
	}
	if b := s.TokenBudget(r.KVCapacityTokens); b > 0 {
		l = max(l, float64(r.OutstandingTokens)/float64(b))
	}
	if s.MaxPrefillWait > 0 {
		l = max(l, r.PrefillWait.Seconds()/s.MaxPrefillWait.Seconds())
	}
	return l
}
