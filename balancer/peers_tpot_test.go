package balancer_test

import (
	"math"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// With other routers sending to a replica, its decodes are stretched by
// their prefills as by this router's own. The step fit learns the batch's
// step without that stretch, so that the prediction — the step over one
// less the prefill load, which counts the others' arrivals — matches what
// a decode there takes instead of counting the others' prefills twice.
func TestPredictorLearnsTheStepUnderOtherRoutersPrefills(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "a", c, replicaOpts{})
	// 50 µs a prompt token, 4,000-token prompts, a 30 ms step, unstretched.
	teach(t, r, c, 20, 4000, 50*time.Microsecond, 0, 30*time.Millisecond)
	finished := uint64(0)
	report(r, c, 0, 0, finished)
	others := func(d time.Duration) { // the other routers send 2 requests a second
		t.Helper()
		for range int(d / (500 * time.Millisecond)) {
			c.advance(500 * time.Millisecond)
			finished++
			report(r, c, 0, 0, finished)
		}
	}
	others(20 * time.Second)
	// Their prefill load is 2/s × 4,000 × 50 µs = 0.4: a 20-token decode
	// takes 19 steps of 30 ms over 0.6 — 50 ms a token.
	const measured = 50 * time.Millisecond
	for range 20 {
		l, err := r.AcquireRequest(balancer.LeaseCost{PromptTokens: 4000})
		if err != nil {
			t.Fatal(err)
		}
		c.advance(200 * time.Millisecond)
		l.PrefillDone()
		l.ObserveDecode(20, 19*measured)
		l.Done(nil)
		finished++ // the engine counts this router's request too
		others(10 * time.Second)
	}
	if o := r.EngineLoad().OthersPerS; math.Abs(o-2) > 0.3 {
		t.Fatalf("set-up: others' rate %.2f/s, want ≈ 2", o)
	}
	_, tpot := r.Predict(4000, c.now())
	if d := math.Abs(tpot.Seconds()-measured.Seconds()) / measured.Seconds(); d > 0.1 {
		t.Fatalf("predicted TPOT %v where decodes take %v (%.0f%% off): the others' prefills counted twice?", tpot, measured, 100*d)
	}
}
