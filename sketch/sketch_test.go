package sketch

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/DataDog/sketches-go/ddsketch"
)

// distributions draws durations from shapes latency takes: tight around a
// step time, bimodal (two replica speeds), heavy-tailed, and spanning
// decades.
func distributions() []struct {
	name string
	draw func(r *rand.Rand) time.Duration
} {
	ms := float64(time.Millisecond)
	return []struct {
		name string
		draw func(r *rand.Rand) time.Duration
	}{
		{"normal around 12ms", func(r *rand.Rand) time.Duration { return time.Duration(max(ms, 12*ms+1.5*ms*r.NormFloat64())) }},
		{"bimodal 12ms and 24ms", func(r *rand.Rand) time.Duration {
			if r.IntN(4) == 0 {
				return time.Duration(24*ms + 0.8*ms*r.NormFloat64())
			}
			return time.Duration(12*ms + 0.5*ms*r.NormFloat64())
		}},
		{"exponential mean 30ms", func(r *rand.Rand) time.Duration { return time.Duration(30 * ms * r.ExpFloat64()) }},
		{"lognormal 20us to 20s", func(r *rand.Rand) time.Duration { return time.Duration(ms * math.Exp(2.5*r.NormFloat64())) }},
	}
}

// exactQuantile is the value at rank ⌊q·(n−1)⌋ of sorted: the rank a
// DDSketch reads.
func exactQuantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[int(q*float64(len(sorted)-1))]
}

var testQuantiles = []float64{0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1}

func TestQuantilesWithinRelativeAccuracy(t *testing.T) {
	for _, dist := range distributions() {
		t.Run(dist.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			s := New()
			vals := make([]time.Duration, 50000)
			var sum int64
			for i := range vals {
				vals[i] = dist.draw(r)
				sum += int64(max(vals[i], 0))
				s.Record(vals[i])
			}
			for i := range vals {
				vals[i] = max(vals[i], 0)
			}
			slices.Sort(vals)
			snap := s.Snapshot()
			if snap.Count != uint64(len(vals)) || snap.SumNs != sum {
				t.Fatalf("count %d sum %d, want %d %d", snap.Count, snap.SumNs, len(vals), sum)
			}
			if snap.MinNs != int64(vals[0]) || snap.MaxNs != int64(vals[len(vals)-1]) {
				t.Errorf("extremes %d %d, want %d %d", snap.MinNs, snap.MaxNs, vals[0], vals[len(vals)-1])
			}
			for _, q := range testQuantiles {
				got, ok := snap.Quantile(q)
				want := exactQuantile(vals, q)
				if !ok {
					t.Fatal("empty")
				}
				if want < MinValue {
					if float64(got) > float64(MinValue)*(1+RelativeAccuracy) {
						t.Errorf("q%g = %v, want about %v at most (true %v)", q, got, MinValue, want)
					}
					continue
				}
				if rel := math.Abs(float64(got-want)) / float64(want); rel > RelativeAccuracy+1e-9 {
					t.Errorf("q%g = %v, true %v: relative error %.4f > %g", q, got, want, rel, RelativeAccuracy)
				}
			}
		})
	}
}

// The read side agrees with sketches-go's own DDSketch fed the same values.
func TestQuantilesMatchReferenceDDSketch(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	s := New()
	ref, err := ddsketch.LogUnboundedDenseDDSketch(RelativeAccuracy)
	if err != nil {
		t.Fatal(err)
	}
	for range 20000 {
		d := time.Duration(float64(time.Millisecond) * math.Exp(1.5*r.NormFloat64()))
		d = min(max(d, MinValue+1), MaxValue-1)
		s.Record(d)
		if err := ref.Add(d.Seconds()); err != nil {
			t.Fatal(err)
		}
	}
	snap := s.Snapshot()
	rebuilt := snap.DDSketch()
	for _, q := range testQuantiles[1 : len(testQuantiles)-1] {
		want, err := ref.GetValueAtQuantile(q)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := snap.Quantile(q)
		if math.Abs(got.Seconds()-want) > 1e-9*want+1e-9 {
			t.Errorf("q%g: %v, reference DDSketch %gs", q, got, want)
		}
		if rb, _ := rebuilt.GetValueAtQuantile(q); math.Abs(rb-want) > 1e-12 {
			t.Errorf("q%g: rebuilt DDSketch %g, reference %g", q, rb, want)
		}
	}
}

func TestEdgesOfTheRange(t *testing.T) {
	tests := []struct {
		name string
		vals []time.Duration
	}{
		{"all below the range", []time.Duration{2 * time.Microsecond, 2 * time.Microsecond, 3 * time.Microsecond}},
		{"zero and negative", []time.Duration{0, -time.Second, 0}},
		{"above the range", []time.Duration{2 * MaxValue, 3 * MaxValue}},
		{"one value", []time.Duration{17 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New()
			lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
			for _, v := range tt.vals {
				s.Record(v)
				lo, hi = min(lo, max(v, 0)), max(hi, max(v, 0))
			}
			snap := s.Snapshot()
			for _, q := range []float64{0, 0.5, 1} {
				got, ok := snap.Quantile(q)
				if !ok || got < lo || got > hi {
					t.Errorf("q%g = %v (ok %v), want within the exact [%v, %v]", q, got, ok, lo, hi)
				}
			}
			if got, _ := snap.Quantile(0); got != lo {
				t.Errorf("q0 = %v, want the exact minimum %v", got, lo)
			}
			if got, _ := snap.Quantile(1); got != hi {
				t.Errorf("q1 = %v, want the exact maximum %v", got, hi)
			}
		})
	}
	if _, ok := (Snapshot{}).Quantile(0.5); ok {
		t.Error("an empty snapshot has no quantile")
	}
}

func TestMergeAndSub(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	a, b, all := New(), New(), New()
	for i := range 10000 {
		d := time.Duration(float64(time.Millisecond) * (5 + 20*r.Float64()))
		if i%3 == 0 {
			d *= 40
			b.Record(d)
		} else {
			a.Record(d)
		}
		all.Record(d)
	}
	merged := a.Snapshot()
	if err := merged.Merge(b.Snapshot()); err != nil {
		t.Fatal(err)
	}
	want := all.Snapshot()
	if !slices.Equal(merged.Counts, want.Counts) || merged.IndexOffset != want.IndexOffset || merged.Count != want.Count ||
		merged.SumNs != want.SumNs || merged.MinNs != want.MinNs || merged.MaxNs != want.MaxNs {
		t.Fatalf("merge differs from recording into one sketch:\n%+v\n%+v", merged, want)
	}

	diff, err := want.Sub(a.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	bs := b.Snapshot()
	if !slices.Equal(diff.Counts, bs.Counts) || diff.IndexOffset != bs.IndexOffset || diff.Count != bs.Count || diff.SumNs != bs.SumNs {
		t.Fatalf("all − a differs from b:\n%+v\n%+v", diff, bs)
	}
	if diff.MinNs > bs.MinNs || diff.MaxNs < bs.MaxNs {
		t.Errorf("after Sub the extremes [%d, %d] must bound b's [%d, %d]", diff.MinNs, diff.MaxNs, bs.MinNs, bs.MaxNs)
	}
	for _, q := range []float64{0, 0.5, 0.99, 1} {
		g, _ := diff.Quantile(q)
		w, _ := bs.Quantile(q)
		if math.Abs(float64(g-w)) > 2*RelativeAccuracy*float64(w) {
			t.Errorf("q%g of the difference %v, of b %v", q, g, w)
		}
	}

	if _, err := a.Snapshot().Sub(want); !errors.Is(err, ErrNotEarlier) {
		t.Errorf("a − all: %v, want ErrNotEarlier", err)
	}
	other := want
	other.RelativeAccuracy = 0.02
	if err := merged.Merge(other); !errors.Is(err, ErrAccuracyMismatch) {
		t.Errorf("merging another accuracy: %v", err)
	}
	var empty Snapshot
	if err := empty.Merge(bs); err != nil || empty.Count != bs.Count {
		t.Errorf("merge into the zero Snapshot: %v, %+v", err, empty)
	}
	if d, err := bs.Sub(Snapshot{}); err != nil || d.Count != bs.Count {
		t.Errorf("b − zero: %v", err)
	}
}

// Recording from many goroutines loses nothing (and is race-free).
func TestRecordConcurrently(t *testing.T) {
	s := New()
	var wg sync.WaitGroup
	const goroutines, each = 8, 5000
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				s.Record(time.Duration(g*each+i) * time.Microsecond)
				if i%1000 == 0 {
					_ = s.Snapshot()
				}
			}
		}()
	}
	wg.Wait()
	snap := s.Snapshot()
	n := goroutines * each
	if snap.Count != uint64(n) || snap.MinNs != 0 || snap.MaxNs != int64(n-1)*int64(time.Microsecond) {
		t.Fatalf("count %d min %d max %d", snap.Count, snap.MinNs, snap.MaxNs)
	}
	if want := int64(n) * int64(n-1) / 2 * int64(time.Microsecond); snap.SumNs != want {
		t.Fatalf("sum %d, want %d", snap.SumNs, want)
	}
}

func TestRecordDoesNotAllocate(t *testing.T) {
	s := New()
	w := NewWindows(time.Second, 4)
	at := time.Unix(1000, 0)
	d := 12 * time.Millisecond
	if n := testing.AllocsPerRun(1000, func() { s.Record(d); d += time.Microsecond }); n != 0 {
		t.Errorf("Sketch.Record: %v allocations", n)
	}
	if n := testing.AllocsPerRun(1000, func() { w.Record(at, d); at = at.Add(10 * time.Millisecond) }); n != 0 {
		t.Errorf("Windows.Record (crossing windows): %v allocations", n)
	}
}

func TestBins(t *testing.T) {
	l := newLayout()
	if l.n != Bins() || l.n < 1800 || l.n > 1900 {
		t.Fatalf("%d bins", l.n)
	}
	// Every bin inside the range is DDSketch's: its values within α of its
	// representative value.
	snap := Snapshot{RelativeAccuracy: RelativeAccuracy}
	for _, d := range []time.Duration{MinValue + 1, time.Millisecond, 12345 * time.Microsecond, time.Minute, MaxValue - 1} {
		snap.IndexOffset = l.lo + l.bin(d)
		v := snap.valueNs(0)
		if rel := math.Abs(float64(v)-float64(d)) / float64(d); rel > RelativeAccuracy {
			t.Errorf("%v lands in a bin valued %v (%.4f)", d, time.Duration(v), rel)
		}
	}
}

// BenchmarkSketchRecord is the per-event cost of recording into a sketch.
func BenchmarkSketchRecord(b *testing.B) {
	s := New()
	d := 12 * time.Millisecond
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Record(d + time.Duration(i&1023)*time.Microsecond)
	}
}

// BenchmarkWindowsRecord is the per-event cost the router pays per token
// gap: the window lookup and the record, windows advancing as the
// timestamps do (one per 10 000 events here).
func BenchmarkWindowsRecord(b *testing.B) {
	w := NewWindows(30*time.Second, 32)
	at := time.Unix(1_700_000_000, 0)
	d := 12 * time.Millisecond
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		at = at.Add(3 * time.Millisecond)
		w.Record(at, d+time.Duration(i&1023)*time.Microsecond)
	}
}

// BenchmarkWindowsRecordParallel records from every P at once into one
// replica's ring, as concurrent streams do.
func BenchmarkWindowsRecordParallel(b *testing.B) {
	w := NewWindows(30*time.Second, 32)
	at := time.Unix(1_700_000_000, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := 12 * time.Millisecond
		for pb.Next() {
			d += time.Microsecond
			w.Record(at, d)
		}
	})
}
