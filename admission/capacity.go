package admission

import (
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// LoadSource is the pool whose replicas' load the saturation rule judges:
// *balancer.Pool. Loads appends one entry per available replica to dst
// (freshness already judged) and must not block; it is called under the
// controller's lock.
type LoadSource interface {
	Loads(now time.Time, dst []balancer.ReplicaLoad) []balancer.ReplicaLoad
}

// Admissible is the pool's answer to Capacity: some available replica Fits
// c and, for a long prefill, taking it still leaves ShortLanes replicas
// free of long prefills, so a short request always has somewhere to start
// at once. A pool with no available replica admits everything: the proxy
// then refuses the request at once (503) instead of holding it in a queue
// that nothing will drain until a replica returns.
func (s SaturationConfig) Admissible(loads []ReplicaLoad, c Cost) bool {
	s = s.WithDefaults()
	if len(loads) == 0 {
		return true
	}
	long := s.LongPrefill(c)
	fits, inLong := false, 0
	for i := range loads {
		if loads[i].LongPrefills > 0 {
			inLong++
		}
		if !fits && s.Fits(loads[i], c) {
			fits = true
			if !long {
				return true
			}
		}
	}
	available := len(loads)
	switch {
	case !fits || s.ShortLanes <= 0:
		return fits
	case available > s.ShortLanes:
		return inLong+1 <= available-s.ShortLanes
	default: // too few replicas to keep a lane: one long prefill at a time
		return inLong == 0
	}
}

// LongPrefillCap is the per-replica cap a request of cost c must respect
// when placed: MaxLongPrefills for a long prefill, 0 (no cap) otherwise.
func (s SaturationConfig) LongPrefillCap(c Cost) int {
	s = s.WithDefaults()
	if !s.LongPrefill(c) || s.MaxLongPrefills < 0 {
		return 0
	}
	return s.MaxLongPrefills
}

// poolCapacity is the Capacity a controller builds for Deps.Pool: the
// saturation rule over the pool's load snapshot. Admissible runs under the
// controller's lock, so one reused buffer serves every call.
type poolCapacity struct {
	pool  LoadSource
	sat   SaturationConfig
	clock Clock
	buf   []ReplicaLoad
}

func (p *poolCapacity) Admissible(c Cost) bool {
	p.buf = p.pool.Loads(p.clock.Now(), p.buf[:0])
	return p.sat.Admissible(p.buf, c)
}

// roomRule is the saturation rule as the balancer applies it per replica
// when placing an admitted request (balancer.Request.Room), so the request
// goes to a replica that Fits — the one whose room let it in — rather than
// wherever the policy's own score points.
type roomRule struct{ sat SaturationConfig }

// FitsReplica implements balancer.Room.
func (r *roomRule) FitsReplica(l ReplicaLoad, promptTokens, outputTokens int, tpot time.Duration) bool {
	return r.sat.Fits(l, Cost{PromptTokens: promptTokens, OutputTokens: outputTokens, TPOT: tpot})
}
