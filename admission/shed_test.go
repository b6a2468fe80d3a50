package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// shedErr checks err is a refusal for the reason, matching ErrShed and the
// reason's sentinel, and returns it.
func shedErr(t *testing.T, err error, r Reason) *ShedError {
	t.Helper()
	var se *ShedError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v, want a *ShedError (%s)", err, r)
	}
	if se.Reason != r {
		t.Fatalf("reason = %s, want %s (%v)", se.Reason, r, err)
	}
	if !errors.Is(err, ErrShed) || !errors.Is(err, r.sentinel()) {
		t.Fatalf("%v does not match ErrShed and %v", err, r.sentinel())
	}
	if se.RetryAfter < time.Second {
		t.Fatalf("RetryAfter = %v, want ≥ 1s", se.RetryAfter)
	}
	return se
}

func TestShedReasons(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cfg    Config
		queue  []Cost // queued behind a holder first
		cost   Cost
		reason Reason
	}{
		{"queue full", Config{MaxQueueRequests: 2}, []Cost{tok(1, 0), tok(1, 0)}, tok(1, 0), ReasonQueueFull},
		{"queue full, lower class", Config{MaxQueueRequests: 1}, []Cost{tok(1, 1)}, tok(1, 0), ReasonQueueFull},
		{"queue tokens", Config{MaxQueueTokens: 1000}, []Cost{tok(600, 0)}, tok(500, 0), ReasonQueueTokens},
		{"bigger than the whole queue", Config{MaxQueueTokens: 1000}, nil, tok(1001, 3), ReasonQueueTokens},
		{"no queue", Config{MaxQueueRequests: -1}, nil, tok(1, 0), ReasonQueueFull},
		{"tenant share requests", Config{MaxQueueRequests: 4, TenantQueueShare: 0.5},
			[]Cost{{PromptTokens: 1, Tenant: "a"}, {PromptTokens: 1, Tenant: "a"}}, Cost{PromptTokens: 1, Tenant: "a"}, ReasonTenantShare},
		{"tenant share tokens", Config{MaxQueueTokens: 1000, TenantQueueShare: 0.5},
			[]Cost{{PromptTokens: 400, Tenant: "a"}}, Cost{PromptTokens: 200, Tenant: "a"}, ReasonTenantShare},
		{"deadline already passed", Config{}, nil, Cost{PromptTokens: 1, Deadline: time.Unix(1, 0)}, ReasonDeadline},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, serial(tt.cfg), Deps{})
			h.admitNow("hold", tok(1, 0))
			for i, c := range tt.queue {
				h.add(string(rune('a'+i)), c)
			}
			_, err := h.c.Admit(context.Background(), tt.cost)
			shedErr(t, err, tt.reason)
			if got := metricValue(t, h.c.m.shed[tt.reason].(prometheus.Metric)); got != 1 {
				t.Fatalf("shed_total{reason=%s} = %v, want 1", tt.reason, got)
			}
			if s := h.c.Stats(); s.Queued != len(tt.queue) {
				t.Fatalf("queued = %d, want %d (the refused request must not stay)", s.Queued, len(tt.queue))
			}
			h.none()
		})
	}
}

func TestTenantShareLeavesRoomForOthers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{MaxQueueRequests: 4, TenantQueueShare: 0.5}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("a0", Cost{PromptTokens: 1, Tenant: "a"})
	h.add("a1", Cost{PromptTokens: 1, Tenant: "a"})
	_, err := h.c.Admit(context.Background(), Cost{PromptTokens: 1, Tenant: "a"})
	shedErr(t, err, ReasonTenantShare)
	h.add("b0", Cost{PromptTokens: 1, Tenant: "b"}) // b is unaffected by a's burst
	if s := h.c.Stats(); s.Queued != 3 {
		t.Fatalf("queued %d, want 3", s.Queued)
	}
	// Once a's requests leave, a may queue again (its share record is gone).
	h.release("hold")
	h.release(h.nextAdmitted())
	h.release(h.nextAdmitted())
	h.add("a2", Cost{PromptTokens: 1, Tenant: "a"})
	if len(h.c.shares) > 2 {
		t.Fatalf("share records leak: %v", h.c.shares)
	}
}

func TestHigherClassEvictsNewestLowerClass(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{MaxQueueRequests: 3}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("low-old", tok(1, 0))
	h.add("low-new", tok(1, 0))
	h.add("mid", tok(1, 1))
	h.add("high", tok(1, 2)) // full: evicts the newest of the lowest class
	ev := h.next()
	if ev.name != "low-new" {
		t.Fatalf("evicted %s, want low-new", ev.name)
	}
	shedErr(t, ev.err, ReasonEvicted)
	if !errors.Is(ev.err, ErrQueueFull) {
		t.Fatalf("eviction should match ErrQueueFull: %v", ev.err)
	}
	// Same class as the lowest waiting: no eviction, the arrival is shed.
	_, err := h.c.Admit(context.Background(), tok(1, 0))
	shedErr(t, err, ReasonQueueFull)
	for _, want := range []string{"high", "mid", "low-old"} {
		h.release(map[string]string{"high": "hold", "mid": "high", "low-old": "mid"}[want])
		if got := h.nextAdmitted(); got != want {
			t.Fatalf("admitted %s, want %s", got, want)
		}
	}
}

func TestEvictionForTokensOnlyWhenItMakesRoom(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{MaxQueueTokens: 1000}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("high", tok(700, 2))
	h.add("low", tok(200, 0))
	// 700 (higher, not evictable) + 500 > 1000 even without low: refuse,
	// and leave low alone.
	_, err := h.c.Admit(context.Background(), tok(500, 1))
	shedErr(t, err, ReasonQueueTokens)
	h.none()
	// 700 + 250 fits once low (200) is evicted.
	h.add("mid", tok(250, 1))
	if ev := h.next(); ev.name != "low" {
		t.Fatalf("evicted %s, want low", ev.name)
	}
}

func TestDeadlineRefusedAtOnceFromEstimatedWait(t *testing.T) {
	t.Parallel()
	// Drain rate 100 tokens/s (assumed until measured).
	h := newHarness(t, serial(Config{InitialDrainRate: 100}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("a", tok(1000, 0))
	now := h.clock.Now()
	// b is shorter than a: only its own 100 tokens go before it, 1s < 5s.
	h.add("b", Cost{PromptTokens: 100, Deadline: now.Add(5 * time.Second)})
	// c is the longest: a, b and itself, 3100 tokens = 31s > 5s.
	_, err := h.c.Admit(context.Background(), Cost{PromptTokens: 2000, Deadline: now.Add(5 * time.Second)})
	se := shedErr(t, err, ReasonDeadline)
	if se.Wait != 31*time.Second || se.RetryAfter != 31*time.Second {
		t.Fatalf("Wait %v RetryAfter %v, want 31s both", se.Wait, se.RetryAfter)
	}
	if se.RetryAfterSeconds() != 31 {
		t.Fatalf("RetryAfterSeconds = %d", se.RetryAfterSeconds())
	}
	if s := h.c.Stats(); s.Queued != 2 {
		t.Fatalf("queued %d, want 2", s.Queued)
	}
}

func TestNoDeadlineRefusalWhileDrainRateUnknown(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("a", tok(100000, 0))
	h.add("b", Cost{PromptTokens: 100000, Deadline: h.clock.Now().Add(time.Second)})
	if s := h.c.Stats(); s.Queued != 2 {
		t.Fatalf("queued %d, want 2", s.Queued)
	}
}

// By default a deadline is judged on arrival only: a queued request is
// never refused late, it waits until a slot frees.
func TestQueuedRequestIsNotRefusedLate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("x", Cost{PromptTokens: 1, Deadline: h.clock.Now().Add(5 * time.Second)})
	h.clock.Advance(time.Minute)
	h.none()
	h.release("hold")
	if got := h.nextAdmitted(); got != "x" {
		t.Fatalf("admitted %q, want x", got)
	}
}

func TestDeadlineExpiresWhileQueued(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		cost Cost
	}{
		{"cost deadline", Config{ExpireQueued: true}, Cost{PromptTokens: 1, Deadline: newFakeClock().Now().Add(5 * time.Second)}},
		{"default timeout", Config{DefaultTimeout: 5 * time.Second, ExpireQueued: true}, tok(1, 0)},
		// An SLO deadline expires on its own, whatever the pool's ExpireQueued.
		{"slo deadline", Config{}, Cost{PromptTokens: 1, Deadline: newFakeClock().Now().Add(5 * time.Second), ExpireAtDeadline: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, serial(tt.cfg), Deps{})
			h.admitNow("hold", tok(1, 0))
			h.add("x", tt.cost)
			h.clock.Advance(5*time.Second - 1)
			h.none()
			h.clock.Advance(1)
			ev := h.next()
			shedErr(t, ev.err, ReasonExpired)
			if !errors.Is(ev.err, ErrDeadline) {
				t.Fatalf("want ErrDeadline: %v", ev.err)
			}
			if s := h.c.Stats(); s.Queued != 0 {
				t.Fatalf("queued %d after expiry", s.Queued)
			}
		})
	}
}

func TestAdmittedRequestStopsItsDeadlineTimer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{DefaultTimeout: 5 * time.Second, ExpireQueued: true}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("x", tok(1, 0))
	if n := h.clock.pendingTimers(); n != 1 {
		t.Fatalf("pending timers %d, want 1", n)
	}
	h.release("hold")
	h.nextAdmitted()
	if n := h.clock.pendingTimers(); n != 0 {
		t.Fatalf("pending timers %d after admission, want 0", n)
	}
}

func TestCancelWhileQueued(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{DefaultTimeout: time.Minute, ExpireQueued: true}), Deps{})
	h.admitNow("hold", tok(1, 0))
	ctx, cancel := context.WithCancel(context.Background())
	h.submit(ctx, "gone", tok(1, 0))
	h.add("stays", tok(5, 0))
	cancel()
	ev := h.next()
	if ev.name != "gone" || !errors.Is(ev.err, context.Canceled) {
		t.Fatalf("got %s %v, want gone: context.Canceled", ev.name, ev.err)
	}
	if errors.Is(ev.err, ErrShed) {
		t.Fatal("a cancel is not a shed")
	}
	if s := h.c.Stats(); s.Queued != 1 || s.QueuedTokens != 5 {
		t.Fatalf("stats %+v: the canceled request must leave the queue at once", s)
	}
	if got := metricValue(t, h.c.m.canceled); got != 1 {
		t.Fatalf("canceled_total = %v", got)
	}
	if n := h.clock.pendingTimers(); n != 1 {
		t.Fatalf("pending timers %d, want 1 (stays')", n)
	}
	h.release("hold")
	if got := h.nextAdmitted(); got != "stays" {
		t.Fatalf("admitted %s", got)
	}
}

func TestCanceledContextIsNotQueued(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{}), Deps{})
	h.admitNow("hold", tok(1, 0))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.c.Admit(ctx, tok(1, 0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if s := h.c.Stats(); s.Queued != 0 {
		t.Fatalf("queued %d", s.Queued)
	}
}

func TestRetryAfterFromQueueDrainTime(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{MaxQueueRequests: 2, InitialDrainRate: 100, MaxRetryAfter: 20 * time.Second}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("a", tok(500, 0))
	h.add("b", tok(700, 0))
	_, err := h.c.Admit(context.Background(), tok(1, 0))
	if se := shedErr(t, err, ReasonQueueFull); se.RetryAfter != 12*time.Second {
		t.Fatalf("RetryAfter = %v, want 12s (1200 tokens at 100/s)", se.RetryAfter)
	}
	h.add("c", tok(1, 1)) // evicts b: RetryAfter counts class 0 and up
	ev := h.next()
	se := shedErr(t, ev.err, ReasonEvicted)
	if se.RetryAfter != 5*time.Second {
		t.Fatalf("evicted RetryAfter = %v, want 5s", se.RetryAfter)
	}
	// Capped by MaxRetryAfter.
	h2 := newHarness(t, serial(Config{MaxQueueRequests: 1, InitialDrainRate: 1, MaxRetryAfter: 20 * time.Second}), Deps{})
	h2.admitNow("hold", tok(1, 0))
	h2.add("a", tok(5000, 0))
	_, err = h2.c.Admit(context.Background(), tok(1, 0))
	if se := shedErr(t, err, ReasonQueueFull); se.RetryAfter != 20*time.Second {
		t.Fatalf("RetryAfter = %v, want the 20s cap", se.RetryAfter)
	}
}

func TestShedErrorMessage(t *testing.T) {
	t.Parallel()
	e := &ShedError{Reason: ReasonDeadline, RetryAfter: 1500 * time.Millisecond, Wait: 31 * time.Second}
	if got, want := e.Error(), "admission: request shed: deadline (estimated wait 31s), retry after 1.5s"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	if e.RetryAfterSeconds() != 2 {
		t.Fatalf("RetryAfterSeconds = %d, want 2 (rounded up)", e.RetryAfterSeconds())
	}
	if Reason(99).String() != "reason(99)" {
		t.Fatal(Reason(99).String())
	}
}

func TestContextDeadlineEarlierThanCostDeadline(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	clock.now = time.Now() // context deadlines are wall-clock times
	h := newHarness(t, serial(Config{InitialDrainRate: 100}), Deps{Clock: clock})
	h.clock = clock
	h.admitNow("hold", tok(1, 0))
	h.add("a", tok(1000, 0))
	// The cost's deadline is an hour away, the context's 2s: a and the
	// request itself are 2000 tokens, 20s at 100/s, so the context's
	// deadline refuses it at once.
	ctx, cancel := context.WithDeadline(context.Background(), clock.Now().Add(2*time.Second))
	defer cancel()
	_, err := h.c.Admit(ctx, Cost{PromptTokens: 1000, Deadline: clock.Now().Add(time.Hour)})
	if se := shedErr(t, err, ReasonDeadline); se.Wait != 20*time.Second {
		t.Fatalf("wait %v, want 20s (a, then itself)", se.Wait)
	}
}
