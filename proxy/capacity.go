package proxy

import (
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
)

// PoolCapacity answers admission's question for one pool — can some
// replica take this request now without it queueing inside an engine? — by
// applying the saturation rule to every available replica: the engine's
// last report (stale counts as saturated) blended with the router's own
// reservations and long prefills in flight.
type PoolCapacity struct {
	pool       *balancer.Pool
	sat        admission.SaturationConfig
	staleAfter time.Duration
	now        func() time.Time
}

var _ admission.Capacity = (*PoolCapacity)(nil)

// NewPoolCapacity builds a pool's capacity answer; staleAfter is the same
// bound the balancer's scores use, now nil means time.Now.
func NewPoolCapacity(p *balancer.Pool, sat admission.SaturationConfig, staleAfter time.Duration, now func() time.Time) *PoolCapacity {
	if now == nil {
		now = time.Now
	}
	if staleAfter <= 0 {
		staleAfter = time.Second
	}
	return &PoolCapacity{pool: p, sat: sat.WithDefaults(), staleAfter: staleAfter, now: now}
}

// Admissible implements admission.Capacity. It runs under the controller's
// lock: a scan of atomics, no allocation. A pool with no available replica
// admits everything, so that the proxy refuses it at once (503).
func (c *PoolCapacity) Admissible(cost admission.Cost) bool {
	now := c.now()
	allStale := c.allStale(now)
	long := c.sat.LongPrefill(cost)
	fits, available, inLong := false, 0, 0
	for _, r := range c.pool.Replicas() {
		if !r.Available(now) {
			continue
		}
		available++
		if r.LongPrefills() > 0 {
			inLong++
		}
		if !fits && c.sat.Fits(c.load(r, now, allStale), cost) {
			fits = true
			if !long {
				return true
			}
		}
	}
	// A long prompt may not take the last replicas free of long prefills:
	// short requests must always have somewhere to start at once.
	switch {
	case available == 0:
		// No replica can take anything, however long a request waits: let
		// it through so the proxy answers 503 now, as it does a request
		// arriving while the pool is down, instead of holding it in a
		// queue that nothing will drain until a replica returns.
		return true
	case !fits || c.sat.ShortLanes <= 0:
		return fits
	case available > c.sat.ShortLanes:
		return inLong+1 <= available-c.sat.ShortLanes
	default: // too few replicas to keep a lane: one long prefill at a time
		return inLong == 0
	}
}

// load is r's side of the saturation rule. Stale telemetry saturates a
// replica — unless every available replica is stale (allStale): then
// failing closed would stop the pool, so each is judged by what the router
// itself has placed there against its KV capacity (configuration, which
// doesn't go stale), as the balancer orders stale replicas by router counts.
func (c *PoolCapacity) load(r *balancer.Replica, now time.Time, allStale bool) admission.ReplicaLoad {
	l := admission.ReplicaLoad{
		OutstandingTokens: r.KVReserved(),
		LongPrefills:      int(r.LongPrefills()),
	}
	if e := r.EngineLoad(); e != nil {
		switch {
		case now.Sub(e.At) <= c.staleAfter:
			l.Waiting, l.KVUsage, l.KVCapacityTokens = e.Waiting, e.KVUsage, int64(e.KVCapacityTokens)
		case allStale:
			l.KVCapacityTokens = int64(e.KVCapacityTokens)
		default:
			l.Stale = true
		}
	}
	return l
}

// allStale reports whether every available replica has only stale
// telemetry (one never scraped isn't stale: it has no numbers at all).
func (c *PoolCapacity) allStale(now time.Time) bool {
	n := 0
	for _, r := range c.pool.Replicas() {
		if !r.Available(now) {
			continue
		}
		e := r.EngineLoad()
		if e == nil || now.Sub(e.At) <= c.staleAfter {
			return false
		}
		n++
	}
	return n > 0
}

// longPrefillCap is the per-replica cap a long request must respect when
// placed (0 when the request is not long or there is no cap).
func (c *PoolCapacity) longPrefillCap(cost admission.Cost) int {
	if c == nil || !c.sat.LongPrefill(cost) || c.sat.MaxLongPrefills < 0 {
		return 0
	}
	return c.sat.MaxLongPrefills
}
