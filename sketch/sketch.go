// Package sketch measures latency distributions in line: a relative-error
// quantile sketch (DDSketch's logarithmic bins, the mapping of
// github.com/DataDog/sketches-go) over a fixed range of durations, whose
// counters are allocated once, so recording a value takes no lock and no
// allocation, and a ring of time windows of such sketches, so any recent
// interval can be read back (window.go).
//
// What a sketch answers is exact to RelativeAccuracy: a quantile read from
// it is within 0.5% of the true quantile of the values recorded, the mean is
// exact (the sum is kept in nanoseconds), and the minimum and maximum are
// exact. Sketches merge by adding counts, so per-replica sketches add up to
// a pool's, and windows to an interval's.
package sketch

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/DataDog/sketches-go/ddsketch/mapping"
)

// The range and accuracy every sketch of this package shares, so that any
// two merge.
const (
	// RelativeAccuracy bounds the relative error of every quantile read:
	// DDSketch's α, bins growing by γ = (1+α)/(1−α).
	RelativeAccuracy = 0.005
	// MinValue and MaxValue are the range measured at that accuracy. A
	// smaller value counts in the first bin, a larger one in the last;
	// quantiles are clamped to the exact minimum and maximum, so even a
	// sketch of values all below MinValue reads them exactly.
	MinValue = 10 * time.Microsecond
	MaxValue = 1000 * time.Second
)

// layout is where a duration's bin is: DDSketch's logarithmic mapping,
// restricted to [MinValue, MaxValue]. Immutable.
type layout struct {
	m  *mapping.LogarithmicMapping
	lo int // the mapping's index of bin 0
	n  int // bins
}

func newLayout() *layout {
	m, err := mapping.NewLogarithmicMapping(RelativeAccuracy)
	if err != nil {
		panic("sketch: " + err.Error()) // a constant accuracy in (0, 1) cannot fail
	}
	lo := m.Index(MinValue.Seconds())
	return &layout{m: m, lo: lo, n: m.Index(MaxValue.Seconds()) - lo + 1}
}

// bin is d's bin, clamped to the range.
func (l *layout) bin(d time.Duration) int {
	if d <= MinValue {
		return 0
	}
	if d >= MaxValue {
		return l.n - 1
	}
	return min(max(l.m.Index(d.Seconds())-l.lo, 0), l.n-1)
}

// Sketch counts durations in fixed logarithmic bins. Record may be called
// from any number of goroutines at once; it neither locks nor allocates.
// Build with New; the zero value is not usable.
//
// Its memory is fixed at construction: 4 bytes per bin, Bins() of them
// (about 7.4 KB), plus a few words. Counts are 32-bit: a bin holds up to
// 4·10⁹ values, which is why long-lived measurement keeps sketches per
// window (Windows) rather than one forever.
type Sketch struct {
	l     *layout
	bins  []atomic.Uint32
	sumNs atomic.Int64
	minNs atomic.Int64 // math.MaxInt64 when empty
	maxNs atomic.Int64 // -1 when empty
}

// New returns an empty Sketch with its bins allocated.
func New() *Sketch { return newSketch(newLayout()) }

func newSketch(l *layout) *Sketch {
	s := &Sketch{l: l, bins: make([]atomic.Uint32, l.n)}
	s.minNs.Store(math.MaxInt64)
	s.maxNs.Store(-1)
	return s
}

// Bins is the number of bins every Sketch has.
func Bins() int { return newLayout().n }

// Record counts d; a negative d counts as 0.
func (s *Sketch) Record(d time.Duration) {
	d = max(d, 0)
	s.bins[s.l.bin(d)].Add(1)
	s.sumNs.Add(int64(d))
	// The extremes change rarely: a load, and a swap only for a new one.
	for cur := s.minNs.Load(); int64(d) < cur && !s.minNs.CompareAndSwap(cur, int64(d)); cur = s.minNs.Load() {
	}
	for cur := s.maxNs.Load(); int64(d) > cur && !s.maxNs.CompareAndSwap(cur, int64(d)); cur = s.maxNs.Load() {
	}
}

// reset empties s. Values recorded while it runs may be lost or kept; the
// window ring calls it only on a slot no recorder is writing to (window.go).
func (s *Sketch) reset() {
	for i := range s.bins {
		s.bins[i].Store(0)
	}
	s.sumNs.Store(0)
	s.minNs.Store(math.MaxInt64)
	s.maxNs.Store(-1)
}

// Snapshot copies s's counts. Under concurrent recording it is a consistent
// count of each bin, though the sum may include a value whose bin was read
// before it landed.
func (s *Sketch) Snapshot() Snapshot {
	first, last := -1, -1
	for i := range s.bins {
		if s.bins[i].Load() != 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	snap := Snapshot{RelativeAccuracy: RelativeAccuracy}
	if first < 0 {
		return snap
	}
	snap.IndexOffset = s.l.lo + first
	snap.Counts = make([]uint64, last-first+1)
	for i := range snap.Counts {
		c := uint64(s.bins[first+i].Load())
		snap.Counts[i] = c
		snap.Count += c
	}
	snap.SumNs, snap.MinNs, snap.MaxNs = s.sumNs.Load(), s.minNs.Load(), s.maxNs.Load()
	if snap.MinNs > snap.MaxNs { // a value's bin was read before its extremes were set
		snap.MinNs, snap.MaxNs = snap.valueNs(0), snap.valueNs(len(snap.Counts)-1)
	}
	return snap
}
