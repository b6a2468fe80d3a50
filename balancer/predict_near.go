package balancer

import "math"

// Spreading for the predictive policy (routing.near_equal, as least_loaded
// spreads in near.go). Several routers behind one Service rate the
// replicas from the same scrape and, being deterministic, all send to the
// one predicted fastest until the next scrape shows the pile-up. Choosing
// at random among the replicas predicted about as good makes their
// choices independent where the predictions cannot tell the replicas
// apart. "About as good" keeps near_equal's unit, requests: a replica
// qualifies when its cost is within what near_equal more requests queued
// on the best replica would add to the best's cost (requestCost), and
// when it is predicted to miss no more objectives than the best.

// spread returns best, or, with near_equal set, one of the eligible
// candidates in best's miss group whose cost is within tolerance of
// bestCost, each as likely (reservoir sampling: no allocation). Ratings
// may have moved since the scan; best stays the answer when none
// qualifies any more.
func (p *Predictive) spread(r *Request, candidates []*Replica, pr *prior, st, sp float64,
	best *Replica, bestMiss int, bestCost float64) *Replica {
	if p.near == nil || best == nil || bestMiss >= staleMiss {
		return best
	}
	limit := bestCost + p.near.tol*best.requestCost(r.PromptTokens, pr, st, sp)
	chosen, k := best, 0
	for _, c := range candidates {
		if !eligible(c, r) {
			continue
		}
		if miss, cost, _ := p.rate(c, r, pr, st, sp, false); miss != bestMiss || cost > limit {
			continue
		}
		k++
		if p.near.rand(k) == 0 {
			chosen = c
		}
	}
	return chosen
}

// requestCost is what one more request queued on the replica adds to a
// predictive cost (predicted TTFT over st plus TPOT over sp): a prefill of
// the replica's mean prompt (prompt's, before it has one) at its learned
// rate, and one more request in its batch.
func (r *Replica) requestCost(prompt int, pr *prior, st, sp float64) float64 {
	_, b, ok := r.pred.ttft.coeffs()
	if !ok || b <= 0 {
		b = pr.ttftB
	}
	size := math.Float64frombits(r.pred.meanPrompt.Load())
	if size <= 0 {
		size = float64(max(prompt, 0))
	}
	return b*size/st + r.tpotSlope(pr)/sp
}
