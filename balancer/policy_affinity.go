package balancer

import (
	"math"
	"slices"
	"strconv"
	"sync/atomic"
)

// affinity is consistent hashing with bounded load (Mirrokni et al., 2018):
// a request's key maps to a point on a ring of replica virtual nodes; it
// goes to the first replica clockwise whose load stays within (1+ε)× the
// mean, so equal keys land on the same replica (warm prefix cache, session
// state) without letting a hot key overload it. With no key, or when every
// replica is over the bound, it falls back to least_loaded.
type affinity struct {
	cfg      *ScoreConfig
	key      func(*Request) uint64
	ring     atomic.Pointer[ring]
	fallback scanPicker
}

var (
	_ Picker   = (*affinity)(nil)
	_ preparer = (*affinity)(nil)
)

// vnodes per replica: enough for an even split of keys at small fleets.
const vnodes = 64

type ringPoint struct {
	h uint64
	i int32 // index into the replica slice the ring was built for
}

// ring is the immutable hash ring for one replica slice; base and n
// identify that slice so Pick can tell whether it may use the ring.
type ring struct {
	base   *Replica
	n      int
	points []ringPoint
}

func newAffinity(cfg *ScoreConfig, key func(*Request) uint64) *affinity {
	return &affinity{cfg: cfg, key: key, fallback: scanPicker{s: loadScorer{cfg}}}
}

// hashString is FNV-1a finished with mix: deterministic across processes,
// so every router instance with the same replica names builds the same ring
// (affinity survives restarts and agrees across router replicas).
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return mix(h)
}

// Prepare builds the ring for a new replica set (called by the pool).
func (p *affinity) Prepare(rs []*Replica) {
	if len(rs) == 0 {
		p.ring.Store(nil)
		return
	}
	rg := &ring{base: rs[0], n: len(rs), points: make([]ringPoint, 0, len(rs)*vnodes)}
	for i, r := range rs {
		for v := 0; v < vnodes; v++ {
			rg.points = append(rg.points, ringPoint{h: hashString(r.name + "#" + strconv.Itoa(v)), i: int32(i)})
		}
	}
	slices.SortFunc(rg.points, func(a, b ringPoint) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return 0
	})
	p.ring.Store(rg)
}

// bound is the most in-flight requests (per unit of capacity) a replica
// may hold and still take an affine request.
func (p *affinity) bound(candidates []*Replica) float64 { return loadBound(p.cfg, candidates) }

// loadBound is the bounded-load limit over candidates: (1+ε) times the
// mean in-flight requests with one more, rounded up.
func loadBound(cfg *ScoreConfig, candidates []*Replica) float64 {
	var total int64
	if g := candidates[0].group.Load(); g != nil {
		total = g.Load()
	} else {
		for _, c := range candidates {
			total += c.inFlight.Load()
		}
	}
	return math.Ceil((1 + cfg.Epsilon) * float64(total+1) / float64(len(candidates)))
}

func (p *affinity) fits(c *Replica, r *Request, bound float64) bool {
	return eligible(c, r) && float64(c.inFlight.Load()+1)/c.capacity() <= bound
}

func (p *affinity) Pick(r *Request, candidates []*Replica) *Replica {
	n := len(candidates)
	if n == 0 {
		return nil
	}
	k := p.key(r)
	if k == 0 {
		return p.fallback.Pick(r, candidates)
	}
	bound := p.bound(candidates)
	if rg := p.ring.Load(); rg != nil && rg.n == n && rg.base == candidates[0] {
		pts := rg.points
		start, _ := slices.BinarySearchFunc(pts, k, func(pt ringPoint, k uint64) int {
			switch {
			case pt.h < k:
				return -1
			case pt.h > k:
				return 1
			}
			return 0
		})
		for i := 0; i < len(pts); i++ {
			if c := candidates[pts[(start+i)%len(pts)].i]; p.fits(c, r, bound) {
				return c
			}
		}
		return p.fallback.Pick(r, candidates)
	}
	// A slice the ring wasn't built for (a retry's subset): rendezvous
	// hashing gives the same kind of stickiness with no allocation.
	var best *Replica
	var bestH uint64
	for _, c := range candidates {
		if !p.fits(c, r, bound) {
			continue
		}
		if h := mix(k ^ c.idHash); best == nil || h > bestH {
			best, bestH = c, h
		}
	}
	if best == nil {
		return p.fallback.Pick(r, candidates)
	}
	return best
}

// mix is a 64-bit finaliser (splitmix64) so rendezvous scores are
// independent per replica.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func prefixKey(r *Request) uint64 { return r.PrefixHash }

func sessionKey(r *Request) uint64 {
	if r.AffinityKey == "" {
		return 0
	}
	return hashString(r.AffinityKey) | 1 // never 0, which means "no key"
}
