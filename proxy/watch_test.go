package proxy

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// handTimer is a Timer that fires only when the test calls fire. It
// records every Reset, so a test sees when a watch re-arms.
type handTimer struct {
	mu      sync.Mutex
	f       func()
	resets  []time.Duration
	stopped bool
}

func (h *handTimer) Reset(d time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.resets = append(h.resets, d)
	return true
}

func (h *handTimer) Stop() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	return true
}

func (h *handTimer) fire() { h.f() }

func (h *handTimer) resetCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.resets)
}

// TestWatchInjectedTimer: a watch arms its timer through Options.AfterFunc
// and checks only when that timer fires, so the total deadline is noticed
// on the first check after the injected clock passes it, not by waiting
// for DisconnectCheck.
func TestWatchInjectedTimer(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	var timers []*handTimer
	s := &Server{
		cfg: Config{DisconnectCheck: time.Minute, TotalTimeout: 10 * time.Second},
		to:  timeouts{total: 10 * time.Second},
		now: func() time.Time { return now },
		afterFunc: func(d time.Duration, f func()) Timer {
			h := &handTimer{f: f, resets: []time.Duration{d}} // arming counts as the first reset
			timers = append(timers, h)
			return h
		},
	}
	x := &exchange{s: s, received: t0}
	var aborts []error
	w := s.startWatch(x, nil, abortFunc(func(err error) { aborts = append(aborts, err) }))
	if len(timers) != 1 {
		t.Fatalf("startWatch armed %d injected timers, want 1", len(timers))
	}
	tm := timers[0]
	if len(tm.resets) != 1 || tm.resets[0] != time.Minute {
		t.Fatalf("timer armed with %v, want [DisconnectCheck 1m]", tm.resets)
	}

	now = t0.Add(5 * time.Second) // within the total deadline
	tm.fire()
	if len(aborts) != 0 {
		t.Fatalf("aborted within the deadline: %v", aborts)
	}
	if tm.resetCount() != 2 {
		t.Fatalf("a check that found nothing did not re-arm (%d resets)", tm.resetCount())
	}

	now = t0.Add(11 * time.Second) // past it
	tm.fire()
	if len(aborts) != 1 || !errors.Is(aborts[0], ErrTimeout) {
		t.Fatalf("aborts = %v, want one ErrTimeout", aborts)
	}
	if tm.resetCount() != 2 {
		t.Fatal("the watch re-armed after aborting")
	}

	w.stop()
	if !tm.stopped {
		t.Fatal("stop did not stop the injected timer")
	}
	tm.fire() // a tick already in flight when stop ran
	if len(aborts) != 1 {
		t.Fatalf("a stopped watch aborted again: %v", aborts)
	}
}

// TestWatchRetarget: one watch serves a request's attempts and then its
// response. A check that fires between owners is handed to the next one,
// and so is one that fired at an owner already done with the request.
func TestWatchRetarget(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	var timer *handTimer
	s := &Server{
		cfg: Config{DisconnectCheck: time.Minute, TotalTimeout: 10 * time.Second},
		to:  timeouts{total: 10 * time.Second},
		now: func() time.Time { return now },
		afterFunc: func(d time.Duration, f func()) Timer {
			timer = &handTimer{f: f, resets: []time.Duration{d}}
			return timer
		},
	}
	w := s.startWatch(&exchange{s: s, received: t0}, nil, nil)
	var first, second []error
	w.retarget(abortFunc(func(err error) { first = append(first, err) }))
	timer.fire() // within the deadline: nothing
	w.retarget(nil)
	now = t0.Add(11 * time.Second)
	timer.fire() // past it, between owners
	if len(first) != 0 {
		t.Fatalf("a former owner was aborted: %v", first)
	}
	w.retarget(abortFunc(func(err error) { second = append(second, err) }))
	if len(second) != 1 || !errors.Is(second[0], ErrTimeout) {
		t.Fatalf("the next owner got %v, want the deadline", second)
	}
	var third []error
	w.retarget(abortFunc(func(err error) { third = append(third, err) }))
	if len(third) != 1 {
		t.Fatal("an owner after the one that got the abort was not told")
	}
	w.stop()
	if !timer.stopped {
		t.Fatal("stop did not stop the timer")
	}
}
