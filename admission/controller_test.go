package admission

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestFastPathAdmitsWhileCapacityAllows(t *testing.T) {
	t.Parallel()
	capy := &fakeCapacity{slots: 1}
	h := newHarness(t, Config{}, Deps{Capacity: capy})
	h.admitNow("a", tok(10, 0))
	if s := h.c.Stats(); s.InFlight != 1 || s.OutstandingTokens != 10 || s.Queued != 0 {
		t.Fatalf("stats %+v", s)
	}
	capy.set(0)
	h.add("b", tok(10, 0))
	if s := h.c.Stats(); s.Queued != 1 {
		t.Fatalf("queued %d, want 1", s.Queued)
	}
	// Capacity grew, but nobody said so: b waits for a Poke (or Run).
	capy.set(1)
	h.none()
	h.c.Poke()
	if got := h.nextAdmitted(); got != "b" {
		t.Fatalf("admitted %s", got)
	}
}

func TestQueueWaitsForPlacementBeforeNextAdmission(t *testing.T) {
	t.Parallel()
	capy := &fakeCapacity{}
	h := newHarness(t, Config{}, Deps{Capacity: capy})
	h.add("a", tok(1, 0))
	h.add("b", tok(1, 0))
	// Room for one more: Admissible keeps saying yes until the balancer
	// counts a, so the queue must not admit b on the same answer.
	capy.set(1)
	h.c.Poke()
	if got := h.nextAdmitted(); got != "a" {
		t.Fatalf("admitted %s", got)
	}
	h.c.Poke()
	h.none()
	capy.take()             // the proxy picked and acquired a replica for a
	h.tickets["a"].Placed() // ... and says so
	h.tickets["a"].Placed() // idempotent
	h.none()                // b does not fit any more
	h.release("a")          // a finishes
	capy.set(1)             // the balancer sees the room again
	h.c.Poke()
	if got := h.nextAdmitted(); got != "b" {
		t.Fatalf("admitted %s", got)
	}
}

func TestPlacementWindowOff(t *testing.T) {
	t.Parallel()
	capy := &fakeCapacity{}
	h := newHarness(t, Config{MaxUnplaced: -1}, Deps{Capacity: capy})
	h.add("a", tok(1, 0))
	h.add("b", tok(1, 0))
	capy.set(1)
	h.c.Poke()
	h.nextAdmitted()
	h.nextAdmitted()
}

func TestReleaseIsIdempotentAndZeroTicketIsInert(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{}, Deps{})
	tk, err := h.c.Admit(context.Background(), tok(10, 0))
	if err != nil || !tk.Admitted() {
		t.Fatalf("Admit: %v", err)
	}
	tk.Release()
	tk.Release()
	if tk.Admitted() {
		t.Fatal("released ticket still admitted")
	}
	if s := h.c.Stats(); s.InFlight != 0 || s.OutstandingTokens != 0 {
		t.Fatalf("stats %+v", s)
	}
	var zero Ticket
	zero.Release()
	zero.Placed()
	zero.ReleaseUsage(Usage{PromptTokens: 5})
	var _ interface{ Release() } = &zero // compile-time: *Ticket is the design's Ticket
}

func TestOutstandingTokensCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{MaxOutstandingTokens: 100}, Deps{})
	h.admitNow("big", tok(5000, 0)) // an empty pool takes anything
	h.add("a", tok(60, 0))
	h.release("big")
	if got := h.nextAdmitted(); got != "a" {
		t.Fatalf("admitted %s", got)
	}
	h.add("b", tok(50, 0)) // 60+50 > 100
	h.none()
	h.admitNowFails(tok(1, 0))
}

// admitNowFails checks a request cannot be admitted at once (it queues),
// then cancels it.
func (h *harness) admitNowFails(c Cost) {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h.submit(ctx, "probe", c)
	cancel()
	if ev := h.next(); ev.name != "probe" || !errors.Is(ev.err, context.Canceled) {
		h.t.Fatalf("probe: %s %v", ev.name, ev.err)
	}
}

func TestRunRechecksPeriodically(t *testing.T) {
	t.Parallel()
	capy := &fakeCapacity{}
	h := newHarness(t, Config{RecheckInterval: 50 * time.Millisecond}, Deps{Capacity: capy})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.c.Run(ctx) }()
	h.add("a", tok(1, 0))
	capy.set(1) // nobody Pokes
	waitFor(t, func() bool { return h.clock.pendingTimers() > 0 })
	h.none()
	h.clock.Advance(50 * time.Millisecond)
	if got := h.nextAdmitted(); got != "a" {
		t.Fatalf("admitted %s", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestDrainRateLearnedWhileQueued(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{DrainWindow: time.Second, DrainAlpha: 0.5}), Deps{})
	h.admitNow("r0", tok(100, 0))
	for _, n := range []string{"r1", "r2", "r3", "r4", "r5", "r6"} {
		h.add(n, tok(100, 0))
	}
	// One 100-token release every 250ms: 400 tokens/s while saturated.
	prev := "r0"
	for range 4 {
		h.clock.Advance(250 * time.Millisecond)
		h.release(prev)
		prev = h.nextAdmitted()
	}
	if got := h.c.Stats().DrainRate; got != 400 {
		t.Fatalf("drain rate %v, want 400", got)
	}
	// Idle time (queue empty) does not dilute the rate.
	for range 2 {
		h.release(prev)
		prev = h.nextAdmitted()
	}
	h.release(prev)
	h.clock.Advance(time.Hour)
	h.c.Poke()
	if got := h.c.Stats().DrainRate; got != 400 {
		t.Fatalf("drain rate after idle %v, want 400", got)
	}
	if got := metricValue(t, h.c.m.drainRate); got != 400 {
		t.Fatalf("drain rate gauge %v", got)
	}
}

func TestStatsAndMetricsTrackQueue(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{Classes: 2}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("a", tok(10, 0))
	h.add("b", tok(20, 1))
	s := h.c.Stats()
	if s.Queued != 2 || s.QueuedTokens != 30 || s.QueuedByClass[0] != 1 || s.QueuedByClass[1] != 1 || s.Model != "m" {
		t.Fatalf("stats %+v", s)
	}
	if d0, d1 := metricValue(t, h.c.m.depth[0]), metricValue(t, h.c.m.depth[1]); d0 != 1 || d1 != 1 {
		t.Fatalf("depth gauges %v %v", d0, d1)
	}
	if got := metricValue(t, h.c.m.tokens); got != 30 {
		t.Fatalf("queue tokens gauge %v", got)
	}
	h.release("hold")
	h.nextAdmitted()
	if got := metricValue(t, h.c.m.admittedNow); got != 1 {
		t.Fatalf("admitted immediate %v", got)
	}
	if got := metricValue(t, h.c.m.admittedWait); got != 1 {
		t.Fatalf("admitted queued %v", got)
	}
}

// TestConcurrentAdmitRelease hammers one controller from many goroutines
// (run it under -race): some requests are canceled while queued, some
// carry deadlines; the pool's cap must hold throughout and everything must
// balance at the end. (The peak may exceed the fake's slots by a request
// or two: concurrent fast-path admissions can all see the same free slot
// before any is placed, as with a real balancer; the queue's own grants are
// held back until placed, so they never flush on one answer.)
func TestConcurrentAdmitRelease(t *testing.T) {
	t.Parallel()
	const (
		workers = 64
		iters   = 300
		slots   = 3
	)
	var inPool, peak atomic.Int64
	capy := CapacityFunc(func(Cost) bool { return inPool.Load() < slots })
	c, err := New("m", Config{AgingBound: time.Millisecond, TenantFairness: true, TenantQueueShare: 0.5,
		MaxQueueRequests: 16, DefaultTimeout: time.Second}, Deps{Capacity: capy})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go c.Run(ctx)
	var admitted, shed, canceled atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range iters {
				cost := Cost{PromptTokens: 1 + (w*7+i*13)%500, Class: w % 3, Tenant: string(rune('a' + w%5))}
				rctx, cancel := context.WithCancel(ctx)
				if i%7 == 0 {
					go cancel() // some clients go away before, while or after they wait
				}
				tk, err := c.Admit(rctx, cost)
				cancel()
				switch {
				case err == nil:
					admitted.Add(1)
					n := inPool.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					tk.Placed()
					for range 3 { // hold the slot a little
						runtime.Gosched()
					}
					inPool.Add(-1)
					if i%2 == 0 {
						tk.ReleaseUsage(Usage{PromptTokens: cost.PromptTokens, CompletionTokens: 10})
					} else {
						tk.Release()
					}
				case errors.Is(err, ErrShed):
					shed.Add(1)
				case errors.Is(err, context.Canceled):
					canceled.Add(1)
				default:
					t.Errorf("Admit: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	s := c.Stats()
	if s.Queued != 0 || s.InFlight != 0 || s.OutstandingTokens != 0 || s.QueuedTokens != 0 {
		t.Fatalf("unbalanced at the end: %+v", s)
	}
	c.mu.Lock()
	if c.unplaced != 0 || len(c.shares) != 0 {
		t.Errorf("unplaced %d, shares %v", c.unplaced, c.shares)
	}
	for i := range c.classes {
		if q := &c.classes[i]; q.head != nil || q.sjf.len() != 0 || len(q.tenants) != 0 || q.active.len() != 0 {
			t.Errorf("class %d not empty", i)
		}
	}
	c.mu.Unlock()
	if total := admitted.Load() + shed.Load() + canceled.Load(); total != workers*iters {
		t.Fatalf("decisions %d, want %d", total, workers*iters)
	}
	t.Logf("admitted %d, shed %d, canceled %d, peak in pool %d", admitted.Load(), shed.Load(), canceled.Load(), peak.Load())
}

// Waiting and Queued tell a request queued behind a full pool, and none
// once it is let out.
func TestWaitingFollowsTheQueue(t *testing.T) {
	c, err := New("m", Config{MaxInFlight: 1}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	held, err := c.Admit(ctx, Cost{PromptTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	if c.Waiting() || c.Queued() != 0 {
		t.Fatal("waiting with an empty queue")
	}
	got := make(chan error, 1)
	go func() {
		tk, err := c.Admit(ctx, Cost{PromptTokens: 100})
		tk.Release()
		got <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !c.Waiting() {
		if time.Now().After(deadline) {
			t.Fatal("the second request never showed as waiting")
		}
		time.Sleep(time.Millisecond)
	}
	if n := c.Queued(); n != 1 {
		t.Errorf("Queued %d with one request waiting", n)
	}
	held.Release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if c.Waiting() || c.Queued() != 0 {
		t.Error("still waiting after the queued request was let out")
	}
}
