package balancer

// nearEqual spreads least_loaded's picks over the replicas that score
// within tol of the best, uniformly at random. One router corrects each
// replica's last scraped load by what it sent there since, so it never
// sends twice to a replica on the strength of one snapshot; several routers
// behind one Service see each other's sends only at the next scrape, so
// every one of them would take the same replica — the one that looked
// idlest — until then (a herd). Choosing at random among near-equals
// makes the routers' choices independent where the snapshot cannot tell
// the replicas apart. The nil *nearEqual picks the best, as one router
// should.
type nearEqual struct {
	tol  float64       // in the scorer's units (requests per unit of capacity)
	rand func(int) int // uniform in [0,n)
}

// newNearEqual returns the spreading rule for tol, or nil (off) when tol
// is not positive.
func newNearEqual(tol float64, rand func(int) int) *nearEqual {
	if !(tol > 0) {
		return nil
	}
	return &nearEqual{tol: tol, rand: rand}
}

// pick returns best, or, with q set, one of the eligible candidates whose
// score is within q.tol of bestScore, each as likely (reservoir sampling:
// no allocation). Scores may have moved since the scan; best stays the
// answer when none qualifies any more.
func (q *nearEqual) pick(s scorer, r *Request, candidates []*Replica, best *Replica, bestScore float64) *Replica {
	if q == nil {
		return best
	}
	limit := bestScore + q.tol
	chosen, k := best, 0
	for _, c := range candidates {
		if !eligible(c, r) || s.score(c, r.Now) > limit {
			continue
		}
		k++
		if q.rand(k) == 0 {
			chosen = c
		}
	}
	return chosen
}
