package balancer

import "time"

// The least prefill a prompt can have in a pool, from the replicas'
// learned prefill fits and the pool's prefix index: what admission's TTFT
// deadline subtracts (proxy: steer), and the cached part admission leaves
// out of a waiting request's cost (HeldPrefix; proxy: admitNow).

// PrefillTime is the shortest time any available replica of the pool
// would take to prefill a prompt of n tokens with nothing queued ahead, at
// what it has learned (a replica not measured yet at the rate of those
// that are): the least of a request's TTFT that waiting at the router
// cannot save. 0 until some replica of the pool has been measured: what
// admission sheds as unservable in time must not rest on a guess — at
// DefaultPrefillSecondsPerToken, a sixth of an H100's rate on a 9B
// model (32,000 tokens in about a second), the first 16,000-token
// prompts of a run were shed as unable to meet a 2 s TTFT objective
// that they met once sent.
func (p *Pool) PrefillTime(n int, now time.Time) time.Duration {
	return p.PrefillTimeCached(n, nil, now)
}

// PrefillTimeCached is PrefillTime for a prompt of n tokens whose prefix
// index keys are keys (Request.Prefix): on each replica only the tokens
// its prefix cache does not hold, as the pool's index says now. A prompt
// that a replica holds most of can be prefilled there in a fraction of
// its whole prefill time, and a wait at the router that PrefillTime says
// is too long may still leave it its TTFT objective there.
func (p *Pool) PrefillTimeCached(n int, keys []uint64, now time.Time) time.Duration {
	r := Request{PromptTokens: n, Prefix: keys}
	p.lookupPrefix(&r)
	reps := *p.replicas.Load()
	pr := priorOf(reps)
	if !pr.ttftLearned {
		return 0
	}
	best := -1.0
	for _, c := range reps {
		if !c.Available(now) {
			continue
		}
		a, b, ok := c.pred.ttft.coeffs()
		if !ok || b <= 0 {
			a, b = pr.ttftA, pr.ttftB
		}
		tokens := max(n, 0)
		if r.prefix.found() {
			tokens = r.uncached(c)
		}
		if t := a + b*float64(tokens); best < 0 || t < best {
			best = t
		}
	}
	return time.Duration(max(best, 0) * float64(time.Second))
}

// HeldPrefix is how much of a prompt of n tokens, with prefix index keys
// keys (Request.Prefix), the pool's predictive placement would find
// cached where it sends it: the most any available replica holds within
// the load bound cache affinity keeps (cachedWithin), when that is at
// least half the prompt (cachedRoom: the predictive policy then takes
// that replica even without room for the whole prompt). 0 otherwise.
// Admission counts the rest as the request's prefill
// (admission.Cost.SetCached): a follow-up turn whose 14,000-token
// history a replica holds costs that replica a few hundred tokens, and
// judged by its whole prompt it waits at the router behind requests that
// cost ten times more, until the engine has evicted its history.
func (p *Pool) HeldPrefix(n int, keys []uint64, now time.Time) int {
	if len(keys) == 0 || p.prefix.Load() == nil {
		return 0
	}
	r := Request{PromptTokens: n, Prefix: keys, Now: now}
	p.lookupPrefix(&r)
	if !r.prefix.found() {
		return 0
	}
	reps := *p.replicas.Load()
	var total, avail int64 // meanLoad over the available replicas
	for _, c := range reps {
		if c.Available(now) {
			total += c.inFlight.Load()
			avail++
		}
	}
	if avail == 0 {
		return 0
	}
	mean, most := float64(total+1)/float64(avail), 0
	pr := priorOf(reps)
	for _, c := range reps {
		if !c.Available(now) {
			continue
		}
		if k := r.cachedWithin(c, &p.score, mean, &pr); 2*k >= n {
			most = max(most, k)
		}
	}
	return most
}
