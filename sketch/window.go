package sketch

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Windows keeps a Sketch per fixed time window, in a ring of n windows: a
// value is recorded in the window its timestamp falls in (windows are
// aligned to the Unix epoch, every width), and the oldest window's slot is
// cleared for the newest as time passes. Collect merges the windows an
// interval overlaps. Time comes only from the timestamps given, so a fake
// clock drives it in tests.
//
// Record neither allocates nor locks, except for the one call per window
// and slot that finds its slot still holding an older window: that one
// clears it under a mutex (the slot's bins, a few microseconds).
//
// Memory is fixed at construction: n sketches (Bytes).
type Windows struct {
	width int64 // ns
	slots []slot
	mu    sync.Mutex // serialises clearing a slot for a newer window
}

type slot struct {
	epoch atomic.Int64 // the window the slot holds (Unix ns / width); math.MinInt64 for none yet
	s     *Sketch
}

// NewWindows returns a ring of n windows of width each (n ≥ 1, width > 0),
// every sketch allocated now.
func NewWindows(width time.Duration, n int) *Windows {
	if width <= 0 || n < 1 {
		panic("sketch: NewWindows needs a positive width and at least one window")
	}
	l := newLayout()
	w := &Windows{width: int64(width), slots: make([]slot, n)}
	for i := range w.slots {
		w.slots[i].epoch.Store(math.MinInt64)
		w.slots[i].s = newSketch(l)
	}
	return w
}

// Width is the length of one window.
func (w *Windows) Width() time.Duration { return time.Duration(w.width) }

// Retention is how far back the ring reaches: n windows.
func (w *Windows) Retention() time.Duration { return time.Duration(w.width * int64(len(w.slots))) }

// Bytes is the memory the ring holds: its sketches' bins and headers.
func (w *Windows) Bytes() int {
	per := int(unsafe.Sizeof(slot{})+unsafe.Sizeof(Sketch{})) + len(w.slots[0].s.bins)*int(unsafe.Sizeof(atomic.Uint32{}))
	return int(unsafe.Sizeof(Windows{})) + len(w.slots)*per
}

func (w *Windows) epochOf(t time.Time) int64 {
	ns := t.UnixNano()
	e := ns / w.width
	if ns < 0 && ns%w.width != 0 {
		e-- // floor, for clocks before 1970
	}
	return e
}

func (w *Windows) slotOf(e int64) *slot {
	n := int64(len(w.slots))
	return &w.slots[((e%n)+n)%n]
}

// Record counts d in the window holding at. A timestamp older than the
// window its slot holds now (more than the retention ago) is dropped.
func (w *Windows) Record(at time.Time, d time.Duration) {
	e := w.epochOf(at)
	sl := w.slotOf(e)
	if cur := sl.epoch.Load(); cur != e {
		if cur > e {
			return
		}
		w.advance(sl, e)
	}
	sl.s.Record(d)
}

// advance clears sl for window e unless another recorder already did.
// Recorders of e wait on the mutex until it is done; a recorder of the old
// window still between its check and its count is the only one whose value
// can land in the wrong window, n windows later.
func (w *Windows) advance(sl *slot, e int64) {
	w.mu.Lock()
	if sl.epoch.Load() < e {
		sl.s.reset()
		sl.epoch.Store(e)
	}
	w.mu.Unlock()
}

// Collect merges the windows that overlap [since, until]. from and to are
// the interval the merged windows cover: from is later than since when the
// ring no longer holds since's window (it lies more than the retention
// before until, or was recycled while this ran), to is the end of until's
// window. An until before since collects nothing, from = to = since.
func (w *Windows) Collect(since, until time.Time) (snap Snapshot, from, to time.Time) {
	snap.RelativeAccuracy = RelativeAccuracy
	if until.Before(since) {
		return snap, since, since
	}
	first, last := w.epochOf(since), w.epochOf(until)
	first = max(first, last-int64(len(w.slots))+1)
	start := first
	for e := last; e >= first; e-- {
		sl := w.slotOf(e)
		if sl.epoch.Load() > e {
			start = e + 1 // overwritten: this window and the older ones are gone
			break
		}
		if sl.epoch.Load() < e {
			continue // nothing was recorded in e
		}
		p := sl.s.Snapshot()
		if sl.epoch.Load() != e { // cleared while being read
			start = e + 1
			break
		}
		snap.Merge(p) //nolint:errcheck // one accuracy throughout
	}
	return snap, time.Unix(0, start*w.width), time.Unix(0, (last+1)*w.width)
}
