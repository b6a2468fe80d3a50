package balancer_test

import (
	"errors"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

func TestRestingReplicaIsSkippedUntilItsRetryAfter(t *testing.T) {
	c := newFakeClock()
	rs := replicas(t, c, 2)
	p := newPoolT(t, balancer.PoolConfig{Model: "m", Policy: "round_robin"}, rs...)
	rs[0].SetEngineLoad(balancer.EngineLoad{Waiting: 8, At: c.now()}) // its queue is full
	c.advance(time.Millisecond)
	rs[0].Rest(c.now(), c.now().Add(7*time.Second))
	for range 6 {
		if got := p.Pick(&balancer.Request{Now: c.now()}); got != rs[1] {
			t.Fatalf("picked %v while r0 rests", got)
		}
	}
	if until, ok := p.RestEnds(c.now()); ok {
		t.Fatalf("rest end %v reported while r1 has room", until)
	}
	rs[1].Rest(c.now(), c.now().Add(3*time.Second))
	if got := p.Pick(&balancer.Request{Now: c.now()}); got != nil {
		t.Fatalf("picked %s while every replica rests", got.Name())
	}
	if until, ok := p.RestEnds(c.now()); !ok || !until.Equal(c.now().Add(3*time.Second)) {
		t.Fatalf("rest ends %v %v, want the earliest, in 3 s", until, ok)
	}
	loads := p.Loads(c.now(), nil)
	if len(loads) != 2 || !loads[0].Resting || !loads[1].Resting {
		t.Fatalf("loads %+v: resting replicas must read as resting (saturated)", loads)
	}
	c.advance(3 * time.Second)
	if got := p.Pick(&balancer.Request{Now: c.now()}); got != rs[1] {
		t.Fatalf("picked %v after r1's rest ended", got)
	}
	// A scrape taken after the refusal showing the queue as full as
	// before keeps the rest; one showing it drain ends it.
	rs[0].SetEngineLoad(balancer.EngineLoad{Waiting: 8, At: c.now()})
	if !rs[0].Resting(c.now()) {
		t.Fatal("r0's rest ended though its queue is still full")
	}
	rs[0].SetEngineLoad(balancer.EngineLoad{Waiting: 3, At: c.now()})
	if rs[0].Resting(c.now()) {
		t.Fatal("r0 still rests after a scrape showed its queue draining")
	}
	// An engine refusing with an empty queue (a rate limit of its own)
	// rests its whole Retry-After: an empty queue says nothing new.
	rs[1].Rest(c.now(), c.now().Add(2*time.Second))
	c.advance(time.Millisecond)
	rs[1].SetEngineLoad(balancer.EngineLoad{Waiting: 0, At: c.now()})
	if !rs[1].Resting(c.now()) {
		t.Fatal("r1's rest ended on a scrape that showed nothing new")
	}
}

func TestRestIsBounded(t *testing.T) {
	c := newFakeClock()
	r := replicas(t, c, 1)[0]
	r.Rest(c.now(), c.now().Add(time.Hour))
	if got := r.RestUntil(c.now()).Sub(c.now()); got != balancer.MaxRest {
		t.Fatalf("rest %v, want capped at %v", got, balancer.MaxRest)
	}
}

func TestMarkDownReportsTheChangeOnce(t *testing.T) {
	c := newFakeClock()
	r := replicas(t, c, 1)[0]
	if !r.MarkDown() || r.MarkDown() || r.Available(c.now()) {
		t.Fatal("MarkDown must report the first change only and take the replica out")
	}
}

// Envoy's max_ejection_percent: failures spread over a pool open at most
// that share of its breakers (at least one).
func TestEjectionCap(t *testing.T) {
	fail := func(r *balancer.Replica) {
		for range testBreaker.ConsecutiveFailures {
			if l, err := r.Acquire(); err == nil {
				l.Done(errors.New("5xx"))
			}
		}
	}
	tests := []struct {
		name    string
		pct     float64
		n, want int
	}{
		{"default 50% of 4", 0, 4, 2},
		{"10% of 4 still ejects one", 10, 4, 1},
		{"no cap", 100, 4, 4},
		{"50% of 1 ejects the one", 0, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newFakeClock()
			rs := replicas(t, c, tt.n)
			newPoolT(t, balancer.PoolConfig{Model: "m", MaxEjectionPercent: tt.pct}, rs...)
			for _, r := range rs {
				fail(r)
			}
			open := 0
			for _, r := range rs {
				if r.BreakerState() == "open" {
					open++
				}
			}
			if open != tt.want {
				t.Fatalf("%d breakers open, want %d", open, tt.want)
			}
		})
	}
}
