package balancer_test

import (
	"context"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// fakeTicker is a HealthConfig.NewTicker whose ticks the test sends by
// hand. Its channel is unbuffered, so a send returns only once Run is
// waiting for the next tick: the round before it has been applied.
type fakeTicker struct {
	c       chan time.Time
	every   chan time.Duration // receives the period Run asked for
	stopped chan struct{}      // closed when Run stops the ticker
}

func newFakeTicker() *fakeTicker {
	return &fakeTicker{c: make(chan time.Time), every: make(chan time.Duration, 1), stopped: make(chan struct{})}
}

func (f *fakeTicker) newTicker(d time.Duration) (<-chan time.Time, func()) {
	f.every <- d
	return f.c, func() { close(f.stopped) }
}

// TestHealthCheckerRunTicks: with an injected ticker, Run does one round
// per tick and nothing in between, so thresholds are crossed exactly on
// the round the script says, with no real time passing.
func TestHealthCheckerRunTicks(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "a", c, replicaOpts{})
	prober := newFakeProber(map[string][]error{"a": {F, F, S, S}})
	// Unbuffered: each probe waits for the test, which pins Run mid-round.
	prober.probed = make(chan string)
	tk := newFakeTicker()
	h := balancer.NewHealthChecker(balancer.HealthConfig{Interval: 7 * time.Second, UnhealthyThreshold: 2, NewTicker: tk.newTicker},
		prober, func() []*balancer.Replica { return []*balancer.Replica{r} }, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	if d := <-tk.every; d != 7*time.Second {
		t.Fatalf("ticker period %v, want the Interval 7s", d)
	}
	// Healthy after each round: one failure is below the threshold, the
	// second crosses it, one success brings the replica back.
	for round, want := range []bool{true, false, true} {
		<-prober.probed // round+1 probes; Run is blocked until this receive
		if n := prober.callCount("a"); n != round+1 {
			t.Fatalf("round %d: %d probes, want %d (a round ran without a tick)", round+1, n, round+1)
		}
		tk.c <- c.now() // returns once round+1 is applied and Run waits for a tick
		if r.Healthy() != want {
			t.Fatalf("after round %d healthy = %v, want %v", round+1, r.Healthy(), want)
		}
	}
	cancel()
	<-prober.probed // the round the last tick started
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	select {
	case <-tk.stopped:
	default:
		t.Fatal("Run returned without stopping its ticker")
	}
	if n := prober.callCount("a"); n != 4 {
		t.Fatalf("%d probes for 3 ticks, want 4 (one at start, one per tick)", n)
	}
}
