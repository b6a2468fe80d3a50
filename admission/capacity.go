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
// c (with the pool's own rule, poolCapacity, one where c would not finish
// late) and, for a long prefill, taking it still leaves ShortLanes replicas
// free of long prefills, so a short request always has somewhere to start
// at once. A pool with no available replica admits everything: the proxy
// then refuses the request at once (503) instead of holding it in a queue
// that nothing will drain until a replica returns.
func (s SaturationConfig) Admissible(loads []ReplicaLoad, c Cost) bool {
	return s.admissible(loads, c, -1)
}

// admissible is Admissible where the replica that fits must also not be
// late for c by more than slack (late; negative: no such rule).
func (s SaturationConfig) admissible(loads []ReplicaLoad, c Cost, slack time.Duration) bool {
	s = s.WithDefaults()
	if len(loads) == 0 {
		return true
	}
	long := s.LongPrefill(c, fastest(loads))
	var first time.Duration
	if slack >= 0 {
		first = soonest(loads, c)
	}
	fits, inLong := false, 0
	for i := range loads {
		if loads[i].LongPrefills > 0 {
			inLong++
		}
		if !fits && s.holdOn(loads[i], c, long) == HoldNone && (slack < 0 || !late(loads[i], c, first, slack)) {
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
// when placed: MaxLongPrefills for a long prefill (LongPrefill at
// perToken), 0 (no cap) otherwise.
func (s SaturationConfig) LongPrefillCap(c Cost, perToken time.Duration) int {
	s = s.WithDefaults()
	if !s.LongPrefill(c, perToken) || s.MaxLongPrefills < 0 {
		return 0
	}
	return s.MaxLongPrefills
}

// fastest is the least prefill time per token over the replicas in loads
// that may take requests (0 when none says): what makes a prompt long
// for the pool — it holds even the fastest replica's prefill that long.
func fastest(loads []ReplicaLoad) time.Duration {
	var f time.Duration
	for i := range loads {
		if p := loads[i].PrefillPerToken; p > 0 && !loads[i].Stale && !loads[i].Resting && (f == 0 || p < f) {
			f = p
		}
	}
	return f
}

// poolCapacity is the Capacity a controller builds for Deps.Pool: the
// saturation rule over the pool's load snapshot. Admissible runs under the
// controller's lock, so one reused buffer serves every call.
type poolCapacity struct {
	pool  LoadSource
	sat   SaturationConfig
	clock Clock
	buf   []ReplicaLoad
	// perToken is the pool's fastest prefill rate as of the last
	// Admissible (fastest), for the long-prefill class of the ticket the
	// controller issues right after it, under the same lock.
	perToken time.Duration
}

func (p *poolCapacity) Admissible(c Cost) bool {
	now := p.clock.Now()
	p.buf = p.pool.Loads(now, p.buf[:0])
	p.perToken = fastest(p.buf)
	// The time c may still wait is what holding it for a faster replica
	// can cost: a request without a deadline is never held for one.
	slack := time.Duration(-1)
	if !c.Deadline.IsZero() {
		slack = max(c.Deadline.Sub(now), 0)
	}
	return p.sat.admissible(p.buf, c, slack)
}

// holds is Admissible's reasons, replica by replica (SaturationConfig.holds).
func (p *poolCapacity) holds(c Cost, count func(Hold)) {
	now := p.clock.Now()
	p.buf = p.pool.Loads(now, p.buf[:0])
	slack := time.Duration(-1)
	if !c.Deadline.IsZero() {
		slack = max(c.Deadline.Sub(now), 0)
	}
	p.sat.holds(p.buf, c, slack, count)
}

// holds reports, through count, why each available replica has no room
// for c (nothing for one that has), as admissible judges it with slack.
func (s SaturationConfig) holds(loads []ReplicaLoad, c Cost, slack time.Duration, count func(Hold)) {
	s = s.WithDefaults()
	var first time.Duration
	if slack >= 0 {
		first = soonest(loads, c)
	}
	inLong := 0
	for i := range loads {
		if loads[i].LongPrefills > 0 {
			inLong++
		}
	}
	long := s.LongPrefill(c, fastest(loads))
	shortLane := long && s.ShortLanes > 0 &&
		(len(loads) > s.ShortLanes && inLong+1 > len(loads)-s.ShortLanes || len(loads) <= s.ShortLanes && inLong > 0)
	for i := range loads {
		h := s.holdOn(loads[i], c, long)
		switch {
		case h != HoldNone:
		case slack >= 0 && late(loads[i], c, first, slack):
			h = HoldLate
		case shortLane:
			h = HoldShortLane
		default:
			continue
		}
		count(h)
	}
}

// finish is when a request of cost c placed on a replica with load l would
// predict to finish, from now: the prefill queued there, then its output
// at the replica's predicted TPOT (its own prefill, the same on every
// replica of a pool but for speed, left out). 0 when its output is unknown.
func finish(l ReplicaLoad, c Cost) time.Duration {
	if c.OutputTokens <= 0 {
		return 0
	}
	return l.PrefillWait + time.Duration(c.OutputTokens)*l.TPOT
}

// soonest is c's earliest finish over the replicas in loads that may take
// requests (not stale or resting), room or not.
func soonest(loads []ReplicaLoad, c Cost) time.Duration {
	var s time.Duration
	seen := false
	for i := range loads {
		if loads[i].Stale || loads[i].Resting {
			continue
		}
		if f := finish(loads[i], c); !seen || f < s {
			s, seen = f, true
		}
	}
	return s
}

// late reports whether c would finish on l more than slack after its
// soonest finish on any replica: holding it for up to slack (the time
// left before its deadline) until that replica has room would still end
// it sooner. A long generation on a half-speed replica is late: there it
// decodes near its TPOT objective as shorter requests join, and such
// generations ended the conversation trace's busy periods, placed there
// because that replica alone had room; held instead, they go to a faster
// replica as soon as it has room, and the slow one keeps its room for the
// short requests that lose little there.
func late(l ReplicaLoad, c Cost, first, slack time.Duration) bool {
	return finish(l, c)-first > slack
}

// roomRule is the saturation rule as the balancer applies it per replica
// when placing an admitted request (balancer.Request.Room), so the request
// goes to a replica that Fits — the one whose room let it in — rather than
// wherever the policy's own score points.
type roomRule struct{ sat SaturationConfig }

// FitsReplica implements balancer.Room.
// The long-prefill cap is not judged here: the balancer applies the
// ticket's own (Request.LongPrefillCap), decided at admission.
func (r *roomRule) FitsReplica(l ReplicaLoad, promptTokens, outputTokens int, tpot time.Duration) bool {
	return r.sat.holdOn(l, Cost{PromptTokens: promptTokens, OutputTokens: outputTokens, TPOT: tpot}, false) == HoldNone
}
