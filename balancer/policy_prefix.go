package balancer

var _ Picker = (*prefixAffinity)(nil)

// prefixAffinity is "prefix_affinity": a request goes to the replica that
// holds the longest prefix of its prompt in its prefix cache, as the
// pool's index says (PrefixCache), among the replicas whose load stays
// within the bounded-load limit (1+ε)× the mean, so that a hot prefix
// spreads to more replicas instead of turning one into a hot spot; ties,
// and requests nothing holds, to the least loaded. Without an index (or
// a request's blocks) it is consistent hashing on the prompt's first
// bytes with bounded load, as before the index: keyed on a prefix that
// many prompts share (one system prompt), that sent every request to one
// replica until its bound spilled them at random.
type prefixAffinity struct {
	hash *affinity
}

func newPrefixAffinity(cfg *ScoreConfig) *prefixAffinity {
	return &prefixAffinity{hash: newAffinity(cfg, prefixKey)}
}

// Prepare builds the fallback's ring.
func (p *prefixAffinity) Prepare(rs []*Replica) { p.hash.Prepare(rs) }

// Pick returns the replica with the longest cached prefix within the
// load bound, else the least loaded within it.
func (p *prefixAffinity) Pick(r *Request, candidates []*Replica) *Replica {
	if len(candidates) == 0 {
		return nil
	}
	if !r.prefix.looked || !r.prefix.indexed {
		return p.hash.Pick(r, candidates)
	}
	bound := p.hash.bound(candidates)
	s := loadScorer{p.hash.cfg}
	var best *Replica
	bestHeld, bestLoad := -1, 0.0
	for _, c := range candidates {
		if !p.hash.fits(c, r, bound) {
			continue
		}
		held, load := r.CachedTokens(c), s.score(c, r.Now)
		if held > bestHeld || held == bestHeld && load < bestLoad {
			best, bestHeld, bestLoad = c, held, load
		}
	}
	if best == nil {
		return p.hash.fallback.Pick(r, candidates)
	}
	return best
}
