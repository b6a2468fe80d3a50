package admission

import "math"

// Bucket layout of decayingQuantile: log-spaced, bucketsPerOctave per
// doubling (≈9% wide), covering 1 to 2^quantileOctaves tokens.
const (
	bucketsPerOctave = 8
	quantileOctaves  = 21 // 2M tokens: beyond any model's context
	quantileBuckets  = bucketsPerOctave*quantileOctaves + 1
)

// decayingQuantile is a running quantile over positive integers (token
// counts) that forgets old observations exponentially: a histogram with
// log-spaced buckets where each new observation weighs 1/decay times the
// previous one. Not safe for concurrent use. The zero value is not usable:
// set decay with newDecayingQuantile.
type decayingQuantile struct {
	w     [quantileBuckets]float64
	total float64
	inc   float64 // weight of the next observation
	decay float64 // in (0, 1]: how much an observation's weight keeps per newer one
	n     int
}

// newDecayingQuantile remembers roughly the last window observations.
func newDecayingQuantile(window int) decayingQuantile {
	return decayingQuantile{inc: 1, decay: 1 - 1/float64(max(window, 1)+1)}
}

// bucketOf is the bucket whose upper bound is the first ≥ x.
func bucketOf(x int) int {
	if x <= 1 {
		return 0
	}
	i := int(math.Ceil(math.Log2(float64(x)) * bucketsPerOctave))
	return min(i, quantileBuckets-1)
}

// bucketUpper is bucket i's upper bound.
func bucketUpper(i int) float64 { return math.Exp2(float64(i) / bucketsPerOctave) }

// add records one observation.
func (s *decayingQuantile) add(x int) {
	s.inc /= s.decay
	s.w[bucketOf(x)] += s.inc
	s.total += s.inc
	s.n++
	if s.inc > 1e100 { // renormalise long before float64 overflows
		for i := range s.w {
			s.w[i] /= s.inc
		}
		s.total /= s.inc
		s.inc = 1
	}
}

// quantile returns the q-quantile (0 < q < 1), interpolated geometrically
// within its bucket; 0 when nothing was observed.
func (s *decayingQuantile) quantile(q float64) float64 {
	if s.total <= 0 {
		return 0
	}
	target := q * s.total
	var cum float64
	for i, w := range s.w {
		if w <= 0 {
			continue
		}
		if cum+w >= target {
			if i == 0 {
				return 1
			}
			lo, hi := bucketUpper(i-1), bucketUpper(i)
			return lo * math.Pow(hi/lo, (target-cum)/w)
		}
		cum += w
	}
	return bucketUpper(quantileBuckets - 1)
}
