package sketch

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/DataDog/sketches-go/ddsketch"
	"github.com/DataDog/sketches-go/ddsketch/mapping"
	"github.com/DataDog/sketches-go/ddsketch/store"
)

// Errors of combining snapshots.
var (
	ErrAccuracyMismatch = errors.New("sketch: snapshots of different accuracy")
	ErrNotEarlier       = errors.New("sketch: the snapshot subtracted is not an earlier state of the same sketch")
)

// Snapshot is a sketch's counts as plain data: what /debug/latency serves
// and bench merges, subtracts and reads quantiles from. Bins are DDSketch's
// logarithmic mapping with relative accuracy RelativeAccuracy and index
// offset 0, so any DDSketch implementation can rebuild it (DDSketch).
// The zero value is an empty snapshot that merges with any other.
type Snapshot struct {
	// RelativeAccuracy is the mapping's α (0 for the zero value).
	RelativeAccuracy float64 `json:"relative_accuracy"`
	// IndexOffset is the mapping index of Counts[0]: Counts[i] counts the
	// values in [γ^(IndexOffset+i), γ^(IndexOffset+i+1)) seconds (values
	// outside the sketch's range in its first and last bins).
	IndexOffset int      `json:"index_offset"`
	Counts      []uint64 `json:"counts"`
	// Count is the sum of Counts.
	Count uint64 `json:"count"`
	// SumNs is the exact sum of the values, in nanoseconds.
	SumNs int64 `json:"sum_ns"`
	// MinNs and MaxNs are the exact extremes (after Sub, bounds of them).
	MinNs int64 `json:"min_ns"`
	MaxNs int64 `json:"max_ns"`
}

func (s Snapshot) mapping() *mapping.LogarithmicMapping {
	a := s.RelativeAccuracy
	if !(a > 0 && a < 1) {
		a = RelativeAccuracy
	}
	m, _ := mapping.NewLogarithmicMapping(a) // a is in (0, 1): no error
	return m
}

// valueNs is the representative value of Counts[i] (DDSketch's: within α
// of every value in the bin), in nanoseconds.
func (s Snapshot) valueNs(i int) int64 {
	return int64(math.Round(s.mapping().Value(s.IndexOffset+i) * 1e9))
}

// Mean is the exact mean; 0 when empty.
func (s Snapshot) Mean() time.Duration {
	if s.Count == 0 {
		return 0
	}
	return time.Duration(s.SumNs / int64(s.Count))
}

// Quantile is the q-quantile (0 ≤ q ≤ 1) as DDSketch reads it — the bin
// holding rank q·(count−1), clamped to the exact extremes — within
// RelativeAccuracy of the true one for values in [MinValue, MaxValue];
// one below MinValue reads as at most MinValue·(1+α). q = 0 and 1 are the
// extremes. ok is false when s is empty.
func (s Snapshot) Quantile(q float64) (d time.Duration, ok bool) {
	if s.Count == 0 || math.IsNaN(q) {
		return 0, false
	}
	switch {
	case q <= 0:
		return time.Duration(s.MinNs), true
	case q >= 1:
		return time.Duration(s.MaxNs), true
	}
	rank := float64(q * float64(s.Count-1)) // no fused multiply-add, as DDSketch
	var n float64
	i := len(s.Counts) - 1
	for j, c := range s.Counts {
		n += float64(c)
		if n > rank {
			i = j
			break
		}
	}
	v := s.valueNs(i)
	return time.Duration(min(max(v, s.MinNs), s.MaxNs)), true
}

// Merge adds o's counts to s.
func (s *Snapshot) Merge(o Snapshot) error {
	if o.Count == 0 {
		return nil
	}
	if s.Count == 0 {
		*s = o.clone()
		return nil
	}
	if s.RelativeAccuracy != o.RelativeAccuracy {
		return fmt.Errorf("%w: %g and %g", ErrAccuracyMismatch, s.RelativeAccuracy, o.RelativeAccuracy)
	}
	lo := min(s.IndexOffset, o.IndexOffset)
	hi := max(s.IndexOffset+len(s.Counts), o.IndexOffset+len(o.Counts))
	counts := make([]uint64, hi-lo)
	copy(counts[s.IndexOffset-lo:], s.Counts)
	for i, c := range o.Counts {
		counts[o.IndexOffset-lo+i] += c
	}
	s.IndexOffset, s.Counts = lo, counts
	s.Count += o.Count
	s.SumNs += o.SumNs
	s.MinNs, s.MaxNs = min(s.MinNs, o.MinNs), max(s.MaxNs, o.MaxNs)
	return nil
}

// Sub is s − before: the values recorded between two snapshots of the same
// sketch (or of the same windows). A bin that shrank means before is not
// an earlier state of s (a window was recycled in between): ErrNotEarlier.
// The extremes of the difference are not known exactly: the result keeps
// s's, which bound them, narrowed to the bins still counted.
func (s Snapshot) Sub(before Snapshot) (Snapshot, error) {
	if before.Count == 0 {
		return s.clone(), nil
	}
	if s.RelativeAccuracy != before.RelativeAccuracy {
		return Snapshot{}, fmt.Errorf("%w: %g and %g", ErrAccuracyMismatch, s.RelativeAccuracy, before.RelativeAccuracy)
	}
	if before.Count > s.Count || before.SumNs > s.SumNs {
		return Snapshot{}, ErrNotEarlier
	}
	out := s.clone()
	for i, c := range before.Counts {
		j := before.IndexOffset + i - s.IndexOffset
		if c == 0 {
			continue
		}
		if j < 0 || j >= len(out.Counts) || out.Counts[j] < c {
			return Snapshot{}, ErrNotEarlier
		}
		out.Counts[j] -= c
	}
	out.Count -= before.Count
	out.SumNs -= before.SumNs
	out.trim()
	return out, nil
}

// trim drops empty bins at both ends and narrows the extremes to the bins
// left: a bin inside the range holds only values in [γ^i, γ^(i+1)).
func (s *Snapshot) trim() {
	first, last := -1, -1
	for i, c := range s.Counts {
		if c != 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		*s = Snapshot{RelativeAccuracy: s.RelativeAccuracy}
		return
	}
	s.Counts = s.Counts[first : last+1]
	s.IndexOffset += first
	m := s.mapping()
	ns := func(sec float64) int64 { return int64(sec * 1e9) }
	if lo := s.IndexOffset; lo > m.Index(MinValue.Seconds()) {
		s.MinNs = max(s.MinNs, ns(m.LowerBound(lo)))
	}
	if hi := s.IndexOffset + len(s.Counts) - 1; hi < m.Index(MaxValue.Seconds()) {
		s.MaxNs = min(s.MaxNs, ns(m.LowerBound(hi+1))+1)
	}
}

func (s Snapshot) clone() Snapshot {
	s.Counts = append([]uint64(nil), s.Counts...)
	return s
}

// DDSketch rebuilds s as a sketches-go DDSketch (values in seconds), for
// its encodings and for tools that already read DDSketches. The exact sum
// and extremes are not part of it.
func (s Snapshot) DDSketch() *ddsketch.DDSketch {
	dd := ddsketch.NewDDSketch(s.mapping(), store.NewDenseStore(), store.NewDenseStore())
	for i, c := range s.Counts {
		if c != 0 {
			dd.GetPositiveValueStore().AddWithCount(s.IndexOffset+i, float64(c))
		}
	}
	return dd
}
