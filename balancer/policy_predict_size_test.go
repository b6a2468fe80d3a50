package balancer_test

import (
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// Among replicas predicted to meet both objectives, a request weighs its
// own decode time on each: a long output goes to the replica that decodes
// it fastest even when that one holds more requests, a short one to the
// less loaded slower replica — so a half-speed replica serves short
// requests (its share of requests, though each stays there twice as long)
// and a long generation isn't stretched to twice its time.
func TestPredictiveSendsLongOutputsWhereTheyDecodeFastest(t *testing.T) {
	c := newFakeClock()
	fast, slow := newReplica(t, "fast", c, replicaOpts{}), newReplica(t, "slow", c, replicaOpts{})
	teachDecode(t, fast, c, 200*time.Microsecond, 30*time.Millisecond, 2*time.Millisecond)
	teachDecode(t, slow, c, 400*time.Microsecond, 60*time.Millisecond, 4*time.Millisecond)
	c.advance(5 * time.Minute) // the teaching prompts no longer load either prefill
	hold := func(r *balancer.Replica, n int) {
		for range n {
			if _, err := r.AcquireRequest(balancer.LeaseCost{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	hold(fast, 4) // TPOT there ≈ 30 + 2·5 = 40 ms
	hold(slow, 2) // ≈ 60 + 4·3 = 72 ms: both meet 100 ms
	p, err := balancer.NewPicker("predictive")
	if err != nil {
		t.Fatal(err)
	}
	cands := []*balancer.Replica{slow, fast}
	for _, tc := range []struct {
		output int
		want   *balancer.Replica
	}{
		{500, fast}, // 20 s of decode on fast, 36 s on slow
		{20, slow},  // 0.8 s against 1.4 s: the lighter load decides
		{0, slow},   // output unknown: load alone
	} {
		req := &balancer.Request{Now: c.now(), PromptTokens: 300, OutputTokens: tc.output,
			SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond}
		for range 3 {
			if got := p.Pick(req, cands); got != tc.want {
				t.Fatalf("%d output tokens, fast 4 in flight, slow 2: picked %s, want %s", tc.output, got.Name(), tc.want.Name())
			}
		}
	}
}

// A request is not placed where it would finish more than its TTFT
// objective after its soonest predicted finish elsewhere, even when that
// is the only replica with room: a long output on the half-speed replica
// decodes at twice the time, near its TPOT objective as shorter requests
// join, and it was those that ended the conversation trace's busy
// periods. The pool's second pass places it on the faster replica, whose
// queued prefill had put it out of room; a short output, which finishes
// on either within the objective of the other, keeps to the room rule.
func TestPredictiveKeepsALongOutputOffAReplicaWhereItFinishesLate(t *testing.T) {
	c := newFakeClock()
	fast, slow := newReplica(t, "fast", c, replicaOpts{}), newReplica(t, "slow", c, replicaOpts{})
	teachDecode(t, fast, c, 200*time.Microsecond, 30*time.Millisecond, 2*time.Millisecond)
	teachDecode(t, slow, c, 400*time.Microsecond, 60*time.Millisecond, 4*time.Millisecond)
	c.advance(5 * time.Minute)
	// 3,000 prompt tokens queued on fast: 0.6 s of prefill, out of
	// roomUnderWait's half second, yet a first token there in ≈ 0.7 s.
	if _, err := fast.AcquireRequest(balancer.LeaseCost{PromptTokens: 3000}); err != nil {
		t.Fatal(err)
	}
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: "predictive"}, []*balancer.Replica{slow, fast})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		output int
		want   *balancer.Replica
	}{
		{500, fast}, // ≈ 18 s on fast, ≈ 32 s on slow
		{20, slow},  // ≈ 1.4 s on either
		{0, slow},   // output unknown: the room rule
	} {
		req := &balancer.Request{Now: c.now(), PromptTokens: 300, OutputTokens: tc.output,
			SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond, Room: roomUnderWait{}}
		if got := pool.Pick(req); got != tc.want {
			t.Errorf("%d output tokens, only slow with room: picked %s, want %s", tc.output, got.Name(), tc.want.Name())
		}
	}
}
