package balancer_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// t0 is the fixed instant every fake clock starts at: tests never read the
// wall clock for a decision, so they don't depend on how fast the machine is.
var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// testBreaker opens after two replica faults and stays open for an hour, so
// no test can see it half-open by accident through the breaker's own wall
// clock (gobreaker keeps one of its own; only pickability follows the
// injected clock).
var testBreaker = balancer.BreakerConfig{ConsecutiveFailures: 2, OpenTimeout: time.Hour}

// fakeClock is the injected `now` of a replica. It is atomic because the
// breaker reads it from inside its state-change callback, which may run on
// another goroutine in the concurrent tests.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t0.UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// replicaOpts tweaks one test replica's starting state.
type replicaOpts struct {
	weight   float64
	inFlight int  // leases acquired and never released
	down     bool // health check verdict false
	open     bool // breaker opened by replica faults
}

// newReplica builds a replica named name on clock c with the given starting
// state. Leases are deliberately leaked: the tests only look at counts.
func newReplica(t testing.TB, name string, c *fakeClock, o replicaOpts) *balancer.Replica {
	t.Helper()
	r, err := balancer.NewReplica(balancer.ReplicaConfig{
		Name:   name,
		URL:    "http://" + name + ".invalid:8000",
		Weight: o.weight,
	}, testBreaker, c.now)
	if err != nil {
		t.Fatalf("NewReplica(%s): %v", name, err)
	}
	for range o.inFlight {
		if _, err := r.Acquire(); err != nil {
			t.Fatalf("Acquire(%s): %v", name, err)
		}
	}
	if o.open {
		openBreaker(t, r)
	}
	if o.down {
		r.SetHealthy(false)
	}
	return r
}

// openBreaker trips r's breaker the way live traffic does: replica faults
// in a row, ConsecutiveFailures of them.
func openBreaker(t testing.TB, r *balancer.Replica) {
	t.Helper()
	for i := range testBreaker.ConsecutiveFailures {
		l, err := r.Acquire()
		if err != nil {
			t.Fatalf("Acquire #%d on %s: %v", i, r.Name(), err)
		}
		l.Done(errors.New("x"))
	}
	if got := r.BreakerState(); got != "open" {
		t.Fatalf("%s: breaker %s after %d faults, want open", r.Name(), got, testBreaker.ConsecutiveFailures)
	}
}

// replicas builds n plain replicas r0..r{n-1} on clock c.
func replicas(t testing.TB, c *fakeClock, n int) []*balancer.Replica {
	t.Helper()
	rs := make([]*balancer.Replica, n)
	for i := range rs {
		rs[i] = newReplica(t, fmt.Sprintf("r%d", i), c, replicaOpts{})
	}
	return rs
}

// countPicks picks n times with p and counts the picks per replica name
// ("<nil>" for no pick). With acquire, every pick takes a lease that is
// never released, which is how concurrent load builds up on a replica.
func countPicks(t testing.TB, p balancer.Picker, req *balancer.Request, cands []*balancer.Replica, n int, acquire bool) map[string]int {
	t.Helper()
	got := make(map[string]int)
	for range n {
		r := p.Pick(req, cands)
		if r == nil {
			got["<nil>"]++
			continue
		}
		got[r.Name()]++
		if acquire {
			if _, err := r.Acquire(); err != nil {
				t.Fatalf("Acquire(%s): %v", r.Name(), err)
			}
		}
	}
	return got
}
