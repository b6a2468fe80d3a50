package balancer

import (
	"sync/atomic"
	"time"
)

// scorer rates one replica for a request; lower is better.
type scorer interface {
	score(r *Replica, now time.Time) float64
}

type loadScorer struct{ c *ScoreConfig }
type kvScorer struct{ c *ScoreConfig }
type tokenScorer struct{ c *ScoreConfig }

func (s loadScorer) score(r *Replica, now time.Time) float64  { return s.c.loadScore(r, now) }
func (s kvScorer) score(r *Replica, now time.Time) float64    { return s.c.kvScore(r, now) }
func (s tokenScorer) score(r *Replica, now time.Time) float64 { return s.c.tokenScore(r, now) }

var (
	_ Picker = (*scanPicker)(nil)
	_ Picker = (*Random)(nil)
	_ Picker = (*P2C)(nil)
)

// scanPicker is a full-scan policy: it scores every available candidate
// and takes the lowest, starting the scan at a rotating offset so equal
// scores share traffic. least_loaded, kv_aware and least_tokens are
// scanPickers with different scorers.
type scanPicker struct {
	next atomic.Uint64
	s    scorer
	near *nearEqual // nil: the best; else at random among near-equals (near.go)
	// cfg is the pool's score config: the load bound and staleness rule
	// a request for a LoRA adapter is placed by (lora.go).
	cfg *ScoreConfig
}

func (p *scanPicker) Pick(r *Request, candidates []*Replica) *Replica {
	n := uint64(len(candidates))
	if n == 0 {
		return nil
	}
	start := p.next.Add(1) - 1
	aware := r.lora.aware && p.cfg != nil
	bound := 0.0
	if aware {
		bound = loadBound(p.cfg, candidates)
	}
	var best *Replica
	var bestScore float64
	var bestAt uint64
	bestTier, bestWait := tierNeutral, 0.0
	for i := uint64(0); i < n; i++ {
		c := candidates[(start+i)%n]
		if !eligible(c, r) {
			continue
		}
		tier, wait := tierNeutral, 0.0
		if aware {
			e, _ := p.cfg.freshEngine(c, r.Now)
			tier, wait = r.tier(c, e, bound)
		}
		// The adapter's tier first (lora.go), then the score.
		sc := p.s.score(c, r.Now)
		if best == nil || tier < bestTier || tier == bestTier && (wait < bestWait || wait == bestWait && sc < bestScore) {
			best, bestScore, bestTier, bestWait, bestAt = c, sc, tier, wait, i
		}
	}
	if best != nil {
		// As RoundRobin: among tied replicas the one after a skipped
		// (ineligible) replica must not inherit its turn.
		advancePast(&p.next, start, bestAt)
		if bestTier == tierNeutral {
			best = p.near.pick(p.s, r, candidates, best, bestScore)
		}
	}
	return best
}

// Random picks a uniformly random available candidate.
type Random struct {
	rand func(int) int
}

func (p *Random) Pick(r *Request, candidates []*Replica) *Replica {
	n := len(candidates)
	if n == 0 {
		return nil
	}
	start := p.rand(n)
	for i := 0; i < n; i++ {
		if c := candidates[(start+i)%n]; eligible(c, r) {
			return c
		}
	}
	return nil
}

// P2C is power of two choices on the least_loaded score: two random
// available candidates, the less loaded wins. Nearly as good as a full scan
// at O(1) cost, and less herd-prone when telemetry is stale.
type P2C struct {
	cfg      *ScoreConfig
	rand     func(int) int
	fallback scanPicker
}

// p2cDraws bounds the random draws spent looking for available candidates
// before falling back to a scan (mostly-unavailable pools).
const p2cDraws = 4

func (p *P2C) Pick(r *Request, candidates []*Replica) *Replica {
	n := len(candidates)
	switch n {
	case 0:
		return nil
	case 1:
		if eligible(candidates[0], r) {
			return candidates[0]
		}
		return nil
	}
	var a, b *Replica
	for d := 0; d < p2cDraws && b == nil; d++ {
		c := candidates[p.rand(n)]
		switch {
		case !eligible(c, r):
		case a == nil:
			a = c
		case c != a:
			b = c
		}
	}
	if b == nil {
		return p.fallback.Pick(r, candidates)
	}
	if p.cfg.loadScore(b, r.Now) < p.cfg.loadScore(a, r.Now) {
		return b
	}
	return a
}
