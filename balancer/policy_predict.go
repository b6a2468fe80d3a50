package balancer

import (
	"slices"
	"sync/atomic"
)

var _ Picker = (*Predictive)(nil)

// Predictive is the latency-predictive policy ("predictive"): for each
// candidate it predicts the request's TTFT — the prefill queued ahead of it
// there plus its own prompt, at the replica's learned prefill rate — and
// its TPOT in the batch it would join, stretched by the prefills arriving
// there and never below what the router sees streaming from it now
// (predict.go), and picks the replica most likely to meet the request's
// SLOs: first those predicted to meet both, not to finish it late
// (lateSlack) and not to stall a request decoding there past its TPOT
// objective (headroom.go), among them the least loaded for this request
// (its requests in flight for its capacity, plus the request's own
// predicted decode time there in TTFT objectives); else those with the
// fewest predicted misses (TTFT, TPOT, late, stall), among them the
// lowest predicted latency (each over its objective, summed), near-ties
// (within tieMargin) to the less loaded. What it learns comes from the router's
// own measurements of every request, so a slow or throttled replica is
// seen as slow after a few of its requests, without a profile or a weight.
//
// Build with NewPicker("predictive"); the zero value is not usable.
type Predictive struct {
	cfg  *ScoreConfig
	next atomic.Uint64
	near *nearEqual // nil: the best; else at random among near-equals (predict_near.go)
}

// tieMargin is how close two predictions must be, relative to the better,
// for load to decide instead: predictions are estimates, and a
// difference this small is noise that would otherwise herd every request
// onto one replica between measurements.
const tieMargin = 0.02

// lateSlack is how much later than its soonest predicted finish on any
// usable replica (TTFT + output × TPOT) a request may be placed to
// finish, in its TTFT objectives; a replica past it counts as a predicted
// miss ("late"). It keeps long generations off a slow replica: there each
// decodes at a TPOT near the objective while shorter requests join its
// batch, and on the conversation trace at 85% load such generations, placed
// on the half-speed replica in its busy periods, were the last requests to
// finish in 22 of 24 runs (runs of 109–128 s where the arrivals end at
// 87 s). Measured there (bench/scripts/vs-haproxy.sh, conv85, 3 runs each):
// at 1 objective the half-speed replica also lost the 50–75-token outputs
// it serves within both objectives when idle (7.5–9% of the requests
// against its 12–15% of the capacity); at 2 it took 80–100-token ones, of
// which 12–18 a run missed the TPOT objective there; at 1.4 neither.
const lateSlack = 1.4

// staleMiss is the miss count of a replica with stale telemetry under the
// fail-closed posture: above any prediction's (TTFT, TPOT, late, stall).
const staleMiss = 5

// Pick returns the replica with the best predicted SLO attainment.
//
// In the pool's room pass (admission placing a request it admitted
// because some replica has room), the best replica with room may be
// predicted to miss an objective — typically a slow replica, the only one
// with room, whose batch would make this request's TPOT too long — while
// a replica whose only lack of room is its queued prefill (over
// admission's max_prefill_wait) is still predicted to meet both: the
// request goes there, since the prediction counts that queue. Not to a
// replica out of room for any other reason (KV cache, token budget,
// engine queue, its streams over the TPOT objective): the prediction sees
// KV exhaustion only at the next scrape, and a request placed there waits
// in the engine's queue for KV to free — seconds.
func (p *Predictive) Pick(r *Request, candidates []*Replica) *Replica {
	best, miss := p.pick(r, candidates)
	if best != nil && miss > 0 && r.roomOn {
		r.roomButPrefill = true
		alt, altMiss := p.pick(r, candidates)
		r.roomButPrefill = false
		if alt != nil && altMiss == 0 {
			return alt
		}
	}
	return p.pickCached(r, candidates, best, miss)
}

// pickCached is Pick's last pass, for a request most of whose prompt a
// replica holds in its prefix cache but that replica has no room by
// admission's rules (its engine has requests waiting, its queued prefill
// is long): the request would prefill there only what it lacks, so it
// goes there when the prediction — which counts the prefill queued ahead
// of it — meets as many objectives as best does, within the cache's
// load bound (cachedWithin). Elsewhere it would prefill its whole prompt
// and leave the cached copy unused.
func (p *Predictive) pickCached(r *Request, candidates []*Replica, best *Replica, miss int) *Replica {
	if !r.roomOn || !r.prefix.found() || (best != nil && r.cachedRoom(best)) {
		return best
	}
	r.roomForCache = true
	alt, altMiss := p.pick(r, candidates)
	r.roomForCache = false
	if alt != nil && r.cachedRoom(alt) && (best == nil || altMiss <= miss) {
		return alt
	}
	return best
}

// pick is Pick over the candidates eligible for r, with the winner's
// predicted misses.
func (p *Predictive) pick(r *Request, candidates []*Replica) (*Replica, int) {
	n := uint64(len(candidates))
	if n == 0 {
		return nil, 0
	}
	pr := priorOf(candidates)
	sloT, sloP := r.SLOTTFT, r.SLOTPOT
	if sloT <= 0 {
		sloT = p.cfg.SLOTTFT
	}
	if sloP <= 0 {
		sloP = p.cfg.SLOTPOT
	}
	st, sp := sloT.Seconds(), sloP.Seconds()
	r.soonest = p.soonest(r, candidates, &pr) // for rate, within this pick
	mean, bound := -1.0, -1.0                 // no cache or adapter affinity
	if r.prefix.found() {
		mean = meanLoad(candidates)
	}
	if r.lora.aware {
		bound = loadBound(p.cfg, candidates)
	}
	start := p.next.Add(1) - 1
	var best *Replica
	var b rating
	var bestAt uint64
	for i := uint64(0); i < n; i++ {
		c := candidates[(start+i)%n]
		if !eligible(c, r) {
			continue
		}
		x := rating{tier: tierNeutral}
		if mean >= 0 {
			x.cached = r.cachedWithin(c, p.cfg, mean, &pr)
		}
		x.miss, x.cost, x.load = p.rate(c, r, &pr, st, sp, 2*x.cached >= r.PromptTokens && x.cached > 0)
		if r.lora.aware {
			e, _ := p.cfg.freshEngine(c, r.Now)
			x.tier, x.wait = r.tier(c, e, bound)
			if x.tier >= tierEvict && x.miss < staleMiss {
				x.miss++ // it waits for a slot: a TTFT the prediction does not see
			}
		}
		if best == nil || x.better(&b) {
			best, b, bestAt = c, x, i
		}
	}
	if best == nil {
		return nil, 0
	}
	advancePast(&p.next, start, bestAt)
	if b.cached > 0 || b.tier != tierNeutral {
		// Chosen for its cache or adapter, or by its adapter's tier
		// among worse ones (a load, a slot to free): spreading, which
		// reads no tier, could take it to a replica without the adapter.
		return best, b.miss
	}
	return p.spread(r, candidates, &pr, st, sp, best, b.miss, b.cost), b.miss
}

// soonest is the earliest predicted finish of r (TTFT + output × TPOT,
// seconds from now) on any replica usable for it, room or not — but for
// one whose telemetry is stale under the fail-closed posture, which rate
// ranks below every prediction; 0 when r's output is unknown.
func (p *Predictive) soonest(r *Request, candidates []*Replica, pr *prior) float64 {
	if r.OutputTokens <= 0 {
		return 0
	}
	var s float64
	for _, c := range candidates {
		if !usable(c, r) {
			continue
		}
		e, stale := p.cfg.freshEngine(c, r.Now)
		if stale && !p.cfg.FailOpen {
			continue
		}
		ttft, tpot := c.predict(r.uncached(c), e, r.Now, pr)
		if f := ttft + float64(r.OutputTokens)*tpot; s == 0 || f < s {
			s = f
		}
	}
	return s
}

// rate predicts c's misses for r (0–4: TTFT, TPOT, late — finishing
// over lateSlack TTFT objectives after r.soonest — and stall: its prefill
// there longer than c's decode headroom, so a request decoding there would
// miss its TPOT objective), its cost (predicted
// TTFT and TPOT, each over its objective, summed; stale telemetry under
// the fail-closed posture adds saturatedScore) and its load for r: in flight
// over capacity, plus r's predicted decode time on c (expected output ×
// predicted TPOT) in units of its TTFT objective. The second term is why
// a long output goes where it decodes fastest and a short one fills a
// slower replica's room: balancing requests in flight alone hands a
// half-speed replica requests of every length, each staying twice as
// long, so it served 10–12% of the requests against its 14% share of the
// capacity, while a 500-token generation there took twice its time.
// For a short output the term is a fraction of a request and load
// decides; 0 when the output is unknown.
//
// holds says c holds most of r's prompt (at least half) in its prefix
// cache, within the cache's load bound (cachedWithin): c is not "late"
// then. Finishing later there comes from the batch c decodes now, which
// changes within seconds on replicas of one speed; anywhere else the
// prompt is prefilled again, seconds of a replica's steps on a long
// history that stall every decode there. On the long-chat trace (chat85,
// even fleet) "late" alone sent 40 of 1,000 requests away from the
// replica holding their history, 350k prompt tokens recomputed (3 points
// of a 25% ideal hit rate). A slow replica's TPOT still counts against
// it, as the TPOT objective, and its load bound still spreads a hot
// conversation.
//
// Nor does c miss the TPOT objective there for the stretch that prompts
// still to arrive would give its decodes (prefillLoad), only for its
// batch's step or what it streams now (tpotUnstretched). The stretch is
// a rate over the coming seconds, and where c holds the prompt, the
// request adds a few blocks to it; anywhere else it adds the whole prompt
// to another replica's. With several routers on one fleet, that stretch
// alone put the replica holding the prompt over the objective in most of
// the picks that gave its cache up, and four routers found half the hits
// one router finds (docs/routing-matrix.md, "why four routers gave the
// cache up").
func (p *Predictive) rate(c *Replica, r *Request, pr *prior, st, sp float64, holds bool) (miss int, cost, load float64) {
	e, stale := p.cfg.freshEngine(c, r.Now)
	var joins EngineLoad
	if e != nil && e.loraBound && r.lora.aware && slices.Contains(e.loraRunning, r.lora.key) {
		// Its adapter runs in a batch bound by its slots: the requests
		// waiting there wait for a slot, and it joins the batch ahead of them.
		joins = *e
		joins.Waiting = 0
		e = &joins
	}
	ttft, tpot := c.predict(r.uncached(c), e, r.Now, pr)
	if ttft > st {
		miss++
	}
	if tpot > sp && !(holds && c.tpotUnstretched(r.Now, pr) <= sp) {
		miss++
	}
	if !holds && r.soonest > 0 && ttft+float64(r.OutputTokens)*tpot-r.soonest > lateSlack*st {
		miss++ // late
	}
	if c.stalls(r.uncached(c), r.Now, pr) {
		miss++ // another request's TPOT
	}
	cost = ttft/st + tpot/sp
	if stale && !p.cfg.FailOpen {
		miss, cost = staleMiss, saturatedScore+cost
	}
	load = float64(c.inFlight.Load()+1) / c.capacity()
	if r.OutputTokens > 0 {
		load += float64(r.OutputTokens) * tpot / st
	}
	return miss, cost, load
}

// rating is a replica's predictive rating for a request (Predictive.rate),
// with its adapter tier (tierNeutral for a request for the base model:
// every replica alike) and the prompt tokens it holds in its prefix cache.
type rating struct {
	miss, tier, cached int
	wait               float64 // for tierEvict: how soon a slot frees (Request.tier)
	cost, load         float64
}

// better orders two ratings: fewer predicted misses; then the better
// adapter tier (Request.tier: the adapter running there, resident, a free
// slot, an adapter to evict; a replica over the load bound has no
// advantage of its adapter), and among those that must evict, the one
// whose slot should free soonest; among replicas
// predicted to meet both objectives, the one holding more of the prompt
// in its prefix cache (cached: 0 for a replica over the bounded-load
// limit, loadBound, so a hot prefix spreads instead of making a hot
// spot) — there its prefill is shorter and the fleet's prefill work
// less — then less load — they share the requests
// instead of the fastest taking every one until it too nears an
// objective, which left a half-speed replica idle in calm periods and
// handed it the requests of a burst, whose prefills then stretched every
// decode there (a replica's share stays bounded by the predictions: it
// takes requests only while they predict both objectives met there);
// among replicas predicted to miss, a cost lower by more than tieMargin,
// then less load.
func (x *rating) better(b *rating) bool {
	if x.miss != b.miss {
		return x.miss < b.miss
	}
	if x.tier != b.tier {
		return x.tier < b.tier
	}
	if x.wait != b.wait {
		return x.wait < b.wait
	}
	if x.miss == 0 && x.cached != b.cached {
		return x.cached > b.cached
	}
	if x.miss == 0 && x.load != b.load {
		return x.load < b.load
	}
	if d := x.cost - b.cost; d < -tieMargin*b.cost || d > tieMargin*x.cost {
		return d < 0
	}
	return x.load < b.load
}
