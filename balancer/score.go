package balancer

import (
	"math"
	"time"
)

// ScoreConfig tunes how load-based policies turn telemetry into a score.
// Zero fields take the defaults in brackets.
type ScoreConfig struct {
	// StaleAfter is how old an engine snapshot may be before it no longer
	// describes the replica [1s: five 200 ms scrape intervals].
	StaleAfter time.Duration
	// FailOpen chooses the posture for stale telemetry: false (default,
	// fail closed) scores the replica as saturated, so it only gets traffic
	// when every replica is stale; true falls back to the router's own
	// in-flight counts. A replica that never reported is scored by router
	// counts either way (telemetry may simply not be configured).
	FailOpen bool
	// WaitingWeight is how many running requests one waiting request is
	// worth: a queued request will wait a whole prefill and more [4].
	WaitingWeight float64
	// KVThreshold is the KV-cache usage above which a replica is close to
	// preempting [0.9]; KVPenalty is the load added at 100% usage, scaled
	// linearly from the threshold [8 requests].
	KVThreshold float64
	KVPenalty   float64
	// PrefillWeight converts prompt tokens into decode-token equivalents for
	// least_tokens: prefill runs far more tokens per step than decode
	// [0.25].
	PrefillWeight float64
	// LongPrefillWeight is the load, in requests, of each long-prompt
	// prefill the replica is running: a new request placed there waits for
	// it (the engine's token budget is spent on the long prompt's chunks),
	// so requests go elsewhere whenever another replica is free of one
	// [1000: in effect, avoid unless every replica runs one].
	LongPrefillWeight float64
	// Epsilon is the bounded-load slack of the affinity policies: a replica
	// takes an affine request only while its load is at most (1+ε)× the
	// mean [0.25].
	Epsilon float64
	// NearEqual makes least_loaded choose at random among the replicas
	// whose score is within this many requests (per unit of capacity) of
	// the lowest, instead of always the lowest: several routers reading
	// the same scrape then stop sending together to the replica that
	// looked idlest (near.go). predictive likewise chooses among the
	// replicas in the best one's miss group whose predicted cost is
	// within what this many more requests on the best would add
	// (predict_near.go). 0 (the default) or less: always the best.
	NearEqual float64
	// SLOTTFT and SLOTPOT are the pool's latency objectives, which the
	// predictive policy picks to meet when a request brings none of its own
	// (Request.SLOTTFT, SLOTPOT) [2s, 100ms].
	SLOTTFT, SLOTPOT time.Duration
}

// Defaults for ScoreConfig's zero fields (see each field).
const (
	DefaultStaleAfter        = time.Second
	DefaultWaitingWeight     = 4.0
	DefaultKVThreshold       = 0.9
	DefaultKVPenalty         = 8.0
	DefaultPrefillWeight     = 0.25
	DefaultLongPrefillWeight = 1000.0
	DefaultEpsilon           = 0.25
	DefaultSLOTTFT           = 2 * time.Second
	DefaultSLOTPOT           = 100 * time.Millisecond
)

func (c ScoreConfig) withDefaults() ScoreConfig {
	if c.StaleAfter <= 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.WaitingWeight <= 0 {
		c.WaitingWeight = DefaultWaitingWeight
	}
	if c.KVThreshold <= 0 || c.KVThreshold >= 1 {
		c.KVThreshold = DefaultKVThreshold
	}
	if c.KVPenalty <= 0 {
		c.KVPenalty = DefaultKVPenalty
	}
	if c.PrefillWeight <= 0 {
		c.PrefillWeight = DefaultPrefillWeight
	}
	if c.LongPrefillWeight <= 0 {
		c.LongPrefillWeight = DefaultLongPrefillWeight
	}
	if c.Epsilon <= 0 {
		c.Epsilon = DefaultEpsilon
	}
	if c.SLOTTFT <= 0 {
		c.SLOTTFT = DefaultSLOTTFT
	}
	if c.SLOTPOT <= 0 {
		c.SLOTPOT = DefaultSLOTPOT
	}
	return c
}

// saturatedScore is added to a replica whose telemetry is stale under the
// fail-closed posture: larger than any real load, so a replica with fresh
// numbers always wins, yet ordered among stale ones by router counts.
const saturatedScore = 1e9

// freshEngine returns the replica's engine snapshot when it is fresh, and
// whether a stale one exists.
func (c *ScoreConfig) freshEngine(r *Replica, now time.Time) (e *EngineLoad, stale bool) {
	e = r.tel.engine.Load()
	if e == nil {
		return nil, false
	}
	if c.stale(e, now) {
		return nil, true
	}
	return e, false
}

// stale is the one staleness rule: the pickers' scores and the load
// snapshot admission reads (Pool.Loads) both apply it.
func (c *ScoreConfig) stale(e *EngineLoad, now time.Time) bool {
	return now.Sub(e.At) > c.StaleAfter
}

// loadScore is least_loaded's score: requests running and waiting in the
// engine (waiting weighted), corrected by what the router sent or saw
// finish since the snapshot and what other routers are expected to have
// sent (othersSince), plus a KV-pressure penalty, all divided by the
// replica's capacity. Lower is better.
func (c *ScoreConfig) loadScore(r *Replica, now time.Time) float64 {
	inFlight := float64(r.inFlight.Load())
	e, stale := c.freshEngine(r, now)
	var load float64
	switch {
	case e != nil:
		delta := inFlight - float64(r.tel.inFlightAtScrape.Load()) + othersSince(e, now)
		load = math.Max(0, float64(e.Running)+c.WaitingWeight*float64(e.Waiting)+delta)
		if e.KVUsage > c.KVThreshold {
			load += c.KVPenalty * (e.KVUsage - c.KVThreshold) / (1 - c.KVThreshold)
		}
		load += e.KVUsage * 1e-3 // tie-breaker: less KV pressure wins
		load += c.LongPrefillWeight * float64(r.longPrefills.Load())
	case stale && !c.FailOpen:
		return saturatedScore + inFlight/r.capacity()
	default:
		load = inFlight + c.LongPrefillWeight*float64(r.longPrefills.Load())
	}
	return load / r.capacity()
}

// kvScore is kv_aware's score: the KV-cache fraction the replica will be
// using once what is already routed to it is admitted — reported usage,
// plus tokens the router sent since the snapshot, plus the share of its
// outstanding tokens that sits in the engine's waiting queue — over its
// capacity. Without a known KV capacity it degrades to outstanding tokens.
func (c *ScoreConfig) kvScore(r *Replica, now time.Time) float64 {
	out := float64(r.tel.outstanding.Load())
	e, stale := c.freshEngine(r, now)
	switch {
	case e != nil && e.KVCapacityTokens > 0:
		capTok := float64(e.KVCapacityTokens)
		sent := math.Max(0, out-float64(r.tel.outstandingAtScrape.Load()))
		waitingTok := 0.0
		if n := e.Running + e.Waiting; n > 0 {
			waitingTok = out * float64(e.Waiting) / float64(n)
		}
		return (e.KVUsage + (sent+waitingTok)/capTok) / r.capacity()
	case stale && !c.FailOpen:
		return saturatedScore + out/r.capacity()
	}
	return out / 1e6 / r.capacity()
}

// tokenScore is least_tokens' score: the outstanding work in tokens over
// the replica's learned decode speed (its capacity when speed is unknown),
// i.e. roughly the seconds it needs to drain what it holds.
func (c *ScoreConfig) tokenScore(r *Replica, now time.Time) float64 {
	out := float64(r.tel.outstanding.Load())
	if _, stale := c.freshEngine(r, now); stale && !c.FailOpen {
		return saturatedScore + out
	}
	speed := r.DecodeSpeed()
	if speed <= 0 {
		speed = 1
	}
	return out / (speed * r.capacity())
}

// Cost is the work a request brings, in decode-token equivalents, for
// AcquireCost: prompt tokens weighted by PrefillWeight plus expected output.
func (c ScoreConfig) Cost(promptTokens, outputTokens int) int64 {
	c = c.withDefaults()
	return int64(math.Round(float64(promptTokens)*c.PrefillWeight)) + int64(outputTokens)
}
