package sketch

import (
	"math"
	"sync"
	"testing"
	"time"
)

func TestWindowsCollect(t *testing.T) {
	base := time.Unix(1_700_000_000, 0) // a multiple of 10 s
	w := NewWindows(10*time.Second, 4)
	// One value per window: 1 ms in window 0, 2 ms in window 1, ...
	for i := range 4 {
		w.Record(base.Add(time.Duration(i)*10*time.Second+time.Second), time.Duration(i+1)*time.Millisecond)
	}
	tests := []struct {
		name         string
		since, until time.Duration // from base
		count        uint64
		min, max     time.Duration
		from, to     time.Duration
	}{
		{"one window", 12 * time.Second, 15 * time.Second, 1, 2 * time.Millisecond, 2 * time.Millisecond, 10 * time.Second, 20 * time.Second},
		{"an instant", 25 * time.Second, 25 * time.Second, 1, 3 * time.Millisecond, 3 * time.Millisecond, 20 * time.Second, 30 * time.Second},
		{"two windows", 5 * time.Second, 19 * time.Second, 2, time.Millisecond, 2 * time.Millisecond, 0, 20 * time.Second},
		{"all", 0, 39 * time.Second, 4, time.Millisecond, 4 * time.Millisecond, 0, 40 * time.Second},
		// Window −1's slot holds window 3 now: the ring reaches no further back than 0.
		{"before the first", -time.Hour, 5 * time.Second, 1, time.Millisecond, time.Millisecond, 0, 10 * time.Second},
		{"future windows are empty", 35 * time.Second, 55 * time.Second, 1, 4 * time.Millisecond, 4 * time.Millisecond, 30 * time.Second, 60 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snap, from, to := w.Collect(base.Add(tt.since), base.Add(tt.until))
			if snap.Count != tt.count || time.Duration(snap.MinNs) != tt.min || time.Duration(snap.MaxNs) != tt.max {
				t.Errorf("count %d [%v, %v], want %d [%v, %v]", snap.Count, time.Duration(snap.MinNs), time.Duration(snap.MaxNs), tt.count, tt.min, tt.max)
			}
			if !from.Equal(base.Add(tt.from)) || !to.Equal(base.Add(tt.to)) {
				t.Errorf("covers [%v, %v], want [%v, %v]", from.Sub(base), to.Sub(base), tt.from, tt.to)
			}
		})
	}
	if snap, from, _ := w.Collect(base.Add(time.Second), base); snap.Count != 0 || !from.Equal(base.Add(time.Second)) {
		t.Errorf("until before since: %+v from %v", snap, from)
	}
}

// As time passes the oldest window's slot is cleared for the newest: what
// the ring no longer holds is reported as not covered, never mixed in.
func TestWindowsRecycle(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	w := NewWindows(10*time.Second, 3)
	for i := range 5 { // windows 0..4; the ring keeps 2, 3, 4
		for range i + 1 {
			w.Record(base.Add(time.Duration(i)*10*time.Second), time.Duration(i+1)*time.Millisecond)
		}
	}
	snap, from, to := w.Collect(base, base.Add(45*time.Second))
	if snap.Count != 3+4+5 || time.Duration(snap.MinNs) != 3*time.Millisecond {
		t.Errorf("count %d min %v, want windows 2–4 only", snap.Count, time.Duration(snap.MinNs))
	}
	if !from.Equal(base.Add(20*time.Second)) || !to.Equal(base.Add(50*time.Second)) {
		t.Errorf("covers [%v, %v], want [20s, 50s]", from.Sub(base), to.Sub(base))
	}
	// Asked about an interval that ended long ago: window 1 is gone.
	if snap, from, _ := w.Collect(base.Add(10*time.Second), base.Add(15*time.Second)); snap.Count != 0 || !from.Equal(base.Add(20*time.Second)) {
		t.Errorf("a recycled window: count %d from %v", snap.Count, from.Sub(base))
	}
	// A late value for a recycled window is dropped, not counted in the
	// window that now holds its slot.
	w.Record(base.Add(15*time.Second), time.Hour)
	if snap, _, _ := w.Collect(base, base.Add(45*time.Second)); snap.Count != 12 {
		t.Errorf("a value for a recycled window was counted: %d", snap.Count)
	}
	// A window skipped (no traffic) reads as empty, not as its slot's old
	// window.
	w.Record(base.Add(70*time.Second), time.Second) // slot of window 7 held window 4
	if snap, _, _ := w.Collect(base.Add(60*time.Second), base.Add(79*time.Second)); snap.Count != 1 {
		t.Errorf("windows 6–7: count %d, want 1", snap.Count)
	}
}

// The subtraction bench does: the current window read at the start of a
// run, taken from the windows read at its end, is exactly the run.
func TestWindowsSubBefore(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	w := NewWindows(10*time.Second, 8)
	for i := range 50 { // before the run, in the run's first window
		w.Record(base.Add(time.Duration(i)*100*time.Millisecond), 100*time.Millisecond)
	}
	start := base.Add(5 * time.Second)
	before, from, _ := w.Collect(start, start)
	run := New()
	for i := range 300 {
		d := time.Duration(10+i%7) * time.Millisecond
		w.Record(start.Add(time.Duration(i)*100*time.Millisecond), d)
		run.Record(d)
	}
	after, from2, _ := w.Collect(from, start.Add(30*time.Second))
	if !from2.Equal(from) {
		t.Fatalf("from moved: %v → %v", from, from2)
	}
	got, err := after.Sub(before)
	if err != nil {
		t.Fatal(err)
	}
	want := run.Snapshot()
	if got.Count != want.Count || got.SumNs != want.SumNs || got.MaxNs < want.MaxNs || got.MinNs > want.MinNs {
		t.Fatalf("run %+v, want %+v", got, want)
	}
	for _, q := range []float64{0.5, 0.99} {
		g, _ := got.Quantile(q)
		x, _ := want.Quantile(q)
		if math.Abs(float64(g-x)) > RelativeAccuracy*float64(x) {
			t.Errorf("q%g %v, want %v within %g", q, g, x, RelativeAccuracy)
		}
	}
}

// Recorders crossing into a new window together, and readers, race
// cleanly: every value recorded in a live window is counted once.
func TestWindowsConcurrentAdvance(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	w := NewWindows(time.Second, 64)
	var wg sync.WaitGroup
	const goroutines, each = 8, 4000
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				w.Record(base.Add(time.Duration(i)*time.Millisecond*10), time.Duration(g+1)*time.Millisecond)
				if i%500 == 0 {
					w.Collect(base, base.Add(time.Minute))
				}
			}
		}()
	}
	wg.Wait()
	snap, from, _ := w.Collect(base, base.Add(40*time.Second))
	if snap.Count != goroutines*each || !from.Equal(base) {
		t.Fatalf("count %d from %v, want %d from the start", snap.Count, from.Sub(base), goroutines*each)
	}
}

func TestWindowsBytes(t *testing.T) {
	w := NewWindows(30*time.Second, 32)
	b := w.Bytes()
	if min, max := 32*4*Bins(), 32*4*Bins()+32*256; b < min || b > max {
		t.Errorf("Bytes %d, want about %d", b, min)
	}
	if w.Retention() != 16*time.Minute || w.Width() != 30*time.Second {
		t.Errorf("retention %v width %v", w.Retention(), w.Width())
	}
}
