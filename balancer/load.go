package balancer

import "time"

// ReplicaLoad is one available replica's load as admission's saturation
// rule reads it: the engine's last report blended with the router's own
// counts, with the balancer's staleness rule already applied, so that
// admission and the pickers never judge freshness two ways.
type ReplicaLoad struct {
	Waiting           int     // requests in the engine's waiting queue (vllm:num_requests_waiting) in its last two reports (the fewer: a queue it keeps, see EngineLoad.queued); 0 if stale or unknown
	KVUsage           float64 // KV-cache usage, 0–1 (vllm:kv_cache_usage_perc); 0 if stale or unknown
	KVCapacityTokens  int64   // KV capacity in tokens (num_gpu_blocks × block_size); 0 if unknown
	OutstandingTokens int64   // the most KV-cache tokens the router's requests in flight there will hold at once from now on (kvpeak.go): the token budget's measure; 0 while KVCapacityTokens is 0 (no budget applies)
	LongPrefills      int     // router-side long-prompt requests not yet past prefill (no first token)
	// PrefillWait is how long a request sent now would wait behind the
	// prefill work already queued there: the router's requests not yet
	// past their first token, at the replica's learned prefill rate
	// (predict.go). It does not go stale: it is the router's own count.
	PrefillWait time.Duration
	// ITL is the replica's inter-token latency as the router sees its
	// streams now (liveITL: an EWMA over the output chunks of the last
	// second), 0 when nothing streams there: the step a request placed
	// now would decode in. Like PrefillWait, the router's own measure.
	ITL time.Duration
	// TPOT is the predictive policy's TPOT for one more request placed
	// there now (predict.go: the batch it would join, stretched by the
	// prefills arriving there, never below ITL); 0 when nothing is known
	// of the pool's decode yet. Admission compares replicas' predicted
	// finishes with it, so as not to admit a request on the room of a
	// replica where it would finish late.
	TPOT time.Duration
	// Headroom is how long the requests decoding there (or placed, their
	// decode ahead) can still be stalled before one misses its TPOT
	// objective, when HeadroomKnown (headroom.go); PrefillPerToken is the
	// stall each prompt token placed there adds, the replica's learned
	// prefill time per token. Like PrefillWait, the router's own measures.
	Headroom        time.Duration
	HeadroomKnown   bool
	PrefillPerToken time.Duration
	// Resting marks a replica that refused a request (429/503) and asked
	// for a pause (Replica.Rest): saturated until the pause ends.
	Resting bool
	// Stale marks telemetry older than ScoreConfig.StaleAfter: the numbers
	// no longer describe the replica, and it counts as saturated, never as
	// idle. A replica never scraped is not stale: it has no numbers at all.
	Stale bool
}

// Loads appends to dst the load of every replica a picker could choose at
// now, and returns it. It allocates nothing when dst has room, so the
// admission controller can call it under its lock with a reused buffer.
//
// Stale telemetry saturates a replica — unless every available replica is
// stale: then failing closed would stop the pool, so each is reported with
// only what doesn't go stale (its KV capacity, a configuration fact) and
// the router's own counts, as the pickers order stale replicas by router
// counts.
func (p *Pool) Loads(now time.Time, dst []ReplicaLoad) []ReplicaLoad {
	rs := *p.replicas.Load()
	allStale := p.allStale(rs, now)
	pr := priorOf(rs)
	for _, r := range rs {
		if !r.Available(now) {
			continue
		}
		l := r.loadAt(now, &p.score, allStale)
		e, _ := p.score.freshEngine(r, now)
		_, tpot := r.predict(0, e, now, &pr)
		l.TPOT = time.Duration(tpot * float64(time.Second))
		dst = append(dst, l)
	}
	return dst
}

// loadAt is the replica's entry in Pool.Loads: its engine's last report
// (when fresh under c's staleness rule) and the router's own counts.
// allStale says every available replica of the pool is stale.
func (r *Replica) loadAt(now time.Time, c *ScoreConfig, allStale bool) ReplicaLoad {
	l := ReplicaLoad{
		LongPrefills:    int(r.longPrefills.Load()),
		Resting:         r.Resting(now),
		PrefillWait:     r.prefillWait(),
		ITL:             time.Duration(r.liveITL(now) * float64(time.Second)),
		PrefillPerToken: time.Duration(r.prefillPerToken() * float64(time.Second)),
	}
	if h, ok := r.decodeHeadroom(now); ok {
		l.Headroom, l.HeadroomKnown = time.Duration(h*float64(time.Second)), true
	}
	if e := r.tel.engine.Load(); e != nil {
		switch {
		case !c.stale(e, now):
			l.Waiting, l.KVUsage, l.KVCapacityTokens = e.queued, e.KVUsage, int64(e.KVCapacityTokens)
		case allStale:
			l.KVCapacityTokens = int64(e.KVCapacityTokens)
		default:
			l.Stale = true
		}
	}
	if l.KVCapacityTokens > 0 { // else no token budget applies: no peak to compute
		l.OutstandingTokens = r.kv.peak(now)
	}
	return l
}

// stale applies the pool's staleness bound (ScoreConfig.stale).
func (p *Pool) stale(e *EngineLoad, now time.Time) bool { return p.score.stale(e, now) }

// allStale reports whether every available replica has only stale
// telemetry (one never scraped isn't stale: it has no numbers at all).
func (p *Pool) allStale(rs []*Replica, now time.Time) bool {
	n := 0
	for _, r := range rs {
		if !r.Available(now) {
			continue
		}
		e := r.tel.engine.Load()
		if e == nil || !p.stale(e, now) {
			return false
		}
		n++
	}
	return n > 0
}
