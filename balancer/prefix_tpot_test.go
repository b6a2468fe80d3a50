package balancer_test

import (
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// A replica holding most of a prompt keeps the request when only the
// stretch of prompts still to arrive there (its prefill load) puts it
// over the TPOT objective: elsewhere the request would prefill its whole
// prompt. It still loses the request when its own batch's step is over
// the objective — a slow replica stays slow, cache or not.
func TestPredictiveKeepsTheCacheOverAPredictedPrefillStretch(t *testing.T) {
	stretch := func(t *testing.T, r *balancer.Replica, c *fakeClock) {
		t.Helper()
		// 8,000-token prompts back to back, each prefilled in 0.4 s at
		// 50 µs a token: its prefill is busy all the time, and its
		// decodes are predicted several times their step.
		for range 6 {
			l, err := r.AcquireRequest(balancer.LeaseCost{PromptTokens: 8000})
			if err != nil {
				t.Fatal(err)
			}
			c.advance(400 * time.Millisecond)
			l.PrefillDone()
			l.Done(nil)
		}
	}
	req := func(c *fakeClock) *balancer.Request {
		return &balancer.Request{Now: c.now(), PromptTokens: 16000, OutputTokens: 100, Prefix: keys(3, 1000),
			SLOTTFT: 2 * time.Second, SLOTPOT: 50 * time.Millisecond}
	}

	t.Run("stretch only", func(t *testing.T) {
		pool, rs, idx, c := prefixPool(t, "predictive", 2, false)
		idx.Store(0, keys(3, 1000)[:900]) // rs[0] holds 14,400 of the 16,000 tokens
		stretch(t, rs[0], c)
		r := req(c)
		if _, tpot := rs[0].Predict(1600, c.now()); tpot <= 50*time.Millisecond {
			t.Fatalf("set-up: %v predicted TPOT on the stretched replica, want over the 50 ms objective", tpot)
		}
		if got := pool.Pick(r); got != rs[0] {
			t.Fatalf("picked %s, want %s, which holds 90%% of the prompt and whose batch steps in 30 ms", got.Name(), rs[0].Name())
		}
	})

	t.Run("slow batch", func(t *testing.T) {
		pool, rs, idx, c := prefixPool(t, "predictive", 2, false)
		idx.Store(0, keys(3, 1000)[:900])
		teach(t, rs[0], c, 40, 1000, 50*time.Microsecond, 0, 80*time.Millisecond) // rs[0] now decodes at 80 ms a token
		stretch(t, rs[0], c)
		if got := pool.Pick(req(c)); got != rs[1] {
			t.Fatalf("picked %s, want %s: %s's own step (80 ms) is over the 50 ms objective", got.Name(), rs[1].Name(), rs[0].Name())
		}
	})
}
