package balancer

import (
	"math"
	"time"
)

// Decode headroom: how long the requests decoding on a replica can still
// be stalled before one of them misses its TPOT objective. A prompt
// placed on a replica is prefilled in the steps its running requests
// decode in, so its prefill time there is added to every one of their
// decodes. A request with a long output spreads that over hundreds of
// tokens; one with a short output cannot. On the conversation trace at
// 85% load every request that missed its TPOT objective on the
// half-speed replica (7 a run) was a 12–64-token output decoding there
// while a ~4,000-token prompt, which the replica prefills in 1.9 s,
// was placed beside it: the prompt met its own TTFT objective there, and
// the policy looked no further. The headroom lets the predictive policy
// count that as a miss too (Predictive.rate), and admission find no room
// there for the prompt (ReplicaLoad.Headroom, admission's Fits).
//
// Each request reports its own headroom when it is placed (its decode is
// still ahead, but a prompt placed after it will be prefilled while it
// decodes) and with every output chunk (Lease.ObserveGap): its TPOT
// objective's worth of decode time, less the time it has decoded so far
// and its remaining tokens at the replica's live ITL (its step fit's
// TPOT while nothing streams there). The replica keeps the least
// reported within liveITLFresh: the tightest of its requests, as each
// reports every step, forgotten a second after the one that set it ends.
//
// Only a request that protecting can save, at a price a prompt can pay,
// reports: one with headroom left (one past its objective already would
// otherwise keep every prompt off its replica until it ended) whose
// remaining decode ends within the pool's TTFT objective, so that a
// prompt kept off the replica for it waits at most about that long —
// a single replica decoding a 400-token output with little headroom
// left would otherwise take no long prompt for its twenty seconds.

// noteHeadroom records a request's headroom, seen at now (the exchange's
// clock, as for liveITL): st is its lease state, at placement or after
// its latest gap.
func (r *Replica) noteHeadroom(st *leaseState, now time.Time) {
	left := st.output - 1 - st.gaps // tokens still to come after this one
	if st.output <= 1 || left <= 0 {
		return // done, or its length unknown
	}
	obj, horizon := st.tpotObj, DefaultSLOTTFT.Seconds()
	if p := r.pool.Load(); p != nil {
		horizon = p.score.SLOTTFT.Seconds()
		if obj <= 0 {
			obj = p.score.SLOTPOT.Seconds()
		}
	}
	if obj <= 0 {
		return
	}
	itl := r.liveITL(now)
	if itl <= 0 {
		if c, d, ok := r.pred.tpot.coeffs(); ok {
			itl = max(c+d*float64(r.inFlight.Load()), 0)
		}
	}
	rest := float64(left) * itl
	h := obj*float64(st.output-1) - st.decodeS - rest
	if h <= 0 || rest > horizon {
		return // past saving, or too long to wait for
	}
	n := now.UnixNano()
	// The value and its stamp are two atomics: a report between another's
	// swap and stamp can keep a value a step longer or lose one, an
	// approximation the next step's reports correct.
	for {
		old := r.pred.headroom.Load()
		if at := r.pred.headroomAtNs.Load(); at != 0 && n-at <= int64(liveITLFresh) && h >= math.Float64frombits(old) {
			return // a tighter request reported within the second
		}
		if r.pred.headroom.CompareAndSwap(old, math.Float64bits(h)) {
			r.pred.headroomAtNs.Store(n)
			return
		}
	}
}

// decodeHeadroom is the least headroom a request decoding on the replica
// reported within liveITLFresh of now, in seconds (always positive: a
// request past its objective does not report); false when none did
// (nothing decodes there, nothing with a known length, or nothing that
// protecting can save).
func (r *Replica) decodeHeadroom(now time.Time) (float64, bool) {
	at := r.pred.headroomAtNs.Load()
	if at == 0 || now.UnixNano()-at > int64(liveITLFresh) {
		return 0, false
	}
	return math.Float64frombits(r.pred.headroom.Load()), true
}

// stalls reports whether a request of prompt tokens placed on the
// replica at now would push one of the requests decoding there past its
// TPOT objective: its prefill, at the replica's learned rate (the pool's
// prior before it has one), takes longer than the replica's decode
// headroom. Only its own prefill: the prompts queued ahead were placed
// knowing the headroom, and the live ITL the headroom is reckoned with
// already holds the stalls of the prompts that keep arriving.
func (r *Replica) stalls(prompt int, now time.Time, p *prior) bool {
	h, ok := r.decodeHeadroom(now)
	if !ok || prompt <= 0 {
		return false
	}
	_, b, fit := r.pred.ttft.coeffs()
	if !fit || b <= 0 {
		b = p.ttftB
	}
	return b*float64(prompt) > h
}

// prefillPerToken is the replica's learned prefill time per prompt
// token, in seconds (DefaultPrefillSecondsPerToken before it has one).
func (r *Replica) prefillPerToken() float64 {
	if _, b, ok := r.pred.ttft.coeffs(); ok && b > 0 {
		return b
	}
	return DefaultPrefillSecondsPerToken
}
