package admission

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fakeClock is a Clock that moves only when told. Advance runs due timers
// synchronously, in time order, before returning, so a test knows that a
// deadline has been enforced once Advance returns.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool // or fired; guarded by c.mu
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// Advance moves time forward by d and runs every timer that came due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	live := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t)
		default:
			live = append(live, t)
		}
	}
	c.timers = live
	c.mu.Unlock()
	slices.SortStableFunc(due, func(a, b *fakeTimer) int { return a.at.Compare(b.at) })
	for _, t := range due {
		t.f()
	}
}

// pendingTimers counts timers neither fired nor stopped.
func (c *fakeClock) pendingTimers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped {
			n++
		}
	}
	return n
}

// harness drives a Controller from a test: requests are submitted one at a
// time (each known to be queued before the next), and admissions are
// observed in the order the controller made them.
type harness struct {
	t     *testing.T
	c     *Controller
	clock *fakeClock

	mu      sync.Mutex
	tickets map[string]*Ticket
	events  chan event
}

type event struct {
	name string
	err  error
}

func newHarness(t *testing.T, cfg Config, d Deps) *harness {
	t.Helper()
	clock := newFakeClock()
	if d.Clock == nil {
		d.Clock = clock
	}
	c, err := New("m", cfg, d)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &harness{t: t, c: c, clock: clock, tickets: map[string]*Ticket{}, events: make(chan event, 1024)}
}

// admitNow admits a request that must go through at once.
func (h *harness) admitNow(name string, cost Cost) {
	h.t.Helper()
	tk, err := h.c.Admit(context.Background(), cost)
	if err != nil {
		h.t.Fatalf("%s: Admit: %v", name, err)
	}
	h.mu.Lock()
	h.tickets[name] = &tk
	h.mu.Unlock()
}

// submit starts Admit in a goroutine and returns once the request is
// queued (or decided, if decided at once). cancel cancels its context.
func (h *harness) submit(ctx context.Context, name string, cost Cost) {
	h.t.Helper()
	before := h.arrivals()
	decided := make(chan struct{})
	go func() {
		tk, err := h.c.Admit(ctx, cost)
		if err == nil {
			h.mu.Lock()
			h.tickets[name] = &tk
			h.mu.Unlock()
		}
		close(decided)
		h.events <- event{name, err}
	}()
	waitFor(h.t, func() bool {
		select {
		case <-decided:
			return true
		default:
			return h.arrivals() > before
		}
	})
}

// arrivals counts requests that reached the queue.
func (h *harness) arrivals() uint64 {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.c.seq
}

// add queues a request with a background context.
func (h *harness) add(name string, cost Cost) { h.submit(context.Background(), name, cost) }

// release releases a held ticket.
func (h *harness) release(name string) {
	h.t.Helper()
	h.mu.Lock()
	tk := h.tickets[name]
	delete(h.tickets, name)
	h.mu.Unlock()
	if tk == nil {
		h.t.Fatalf("release %s: no ticket", name)
	}
	tk.Release()
}

// next waits for the next decision.
func (h *harness) next() event {
	h.t.Helper()
	select {
	case ev := <-h.events:
		return ev
	case <-time.After(5 * time.Second): // a hang guard, not synchronisation
		h.t.Fatal("no admission decision within 5s")
		return event{}
	}
}

// serialOrder releases holder, then each request admitted after it, n
// admissions in all, on a pool that takes one request at a time
// (serial): the order its queue let them out.
func (h *harness) serialOrder(holder string, n int) []string {
	h.t.Helper()
	got := make([]string, 0, n)
	for range n {
		h.release(holder)
		holder = h.nextAdmitted()
		got = append(got, holder)
	}
	return got
}

// nextAdmitted waits for the next decision and checks it is an admission.
func (h *harness) nextAdmitted() string {
	h.t.Helper()
	ev := h.next()
	if ev.err != nil {
		h.t.Fatalf("%s: want admitted, got %v", ev.name, ev.err)
	}
	return ev.name
}

// none checks that no decision is pending right now.
func (h *harness) none() {
	h.t.Helper()
	select {
	case ev := <-h.events:
		h.t.Fatalf("unexpected decision: %s (err %v)", ev.name, ev.err)
	default:
	}
}

// waitFor spins (yielding, never sleeping) until cond holds; it fails the
// test after 5s of real time as a hang guard.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 5s")
		}
		runtime.Gosched()
	}
}

// tok is a cost of n tokens (all prompt) in a class.
func tok(n, class int) Cost { return Cost{PromptTokens: n, Class: class} }

// fakeCapacity is a Capacity with a settable answer and a count of calls.
type fakeCapacity struct {
	mu    sync.Mutex
	slots int // how many more requests the pool takes
	calls int
}

func (f *fakeCapacity) Admissible(Cost) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.slots > 0
}

// take is the balancer counting a placed request.
func (f *fakeCapacity) take() {
	f.mu.Lock()
	f.slots--
	f.mu.Unlock()
}

func (f *fakeCapacity) set(n int) {
	f.mu.Lock()
	f.slots = n
	f.mu.Unlock()
}

// metricValue reads a counter's or gauge's current value.
func metricValue(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	t.Fatalf("not a counter or gauge: %v", m.Desc())
	return 0
}
