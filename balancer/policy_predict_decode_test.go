package balancer_test

import (
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// teachDecode teaches r's TTFT fit (prefill perToken, 10 ms fixed) and a
// TPOT fit of fixed + perRequest·(requests in flight), sending requests a
// second apart with 0–3 others held in flight, so both fits have a slope
// and the replica a known arrival rate (one request a second).
func teachDecode(t *testing.T, r *balancer.Replica, c *fakeClock, perToken, fixed, perRequest time.Duration) {
	t.Helper()
	for i := range 16 {
		held := make([]balancer.Lease, i%4)
		for k := range held {
			l, err := r.AcquireRequest(balancer.LeaseCost{})
			if err != nil {
				t.Fatal(err)
			}
			held[k] = l
		}
		prompt := int64(500 + 500*(i%5))
		l, err := r.AcquireRequest(balancer.LeaseCost{PromptTokens: prompt})
		if err != nil {
			t.Fatal(err)
		}
		c.advance(10*time.Millisecond + time.Duration(prompt)*perToken)
		l.PrefillDone()
		tpot := fixed + time.Duration(len(held)+1)*perRequest
		l.ObserveDecode(11, 10*tpot)
		l.Done(nil)
		for _, h := range held {
			h.Done(nil)
		}
		c.advance(time.Second - 10*time.Millisecond - time.Duration(prompt)*perToken)
	}
}

// A replica whose batch decodes near the request's TPOT objective takes
// a short output, which ends before the batch grows, but not a long one:
// the requests that arrive there during a long decode (at its arrival
// rate) would push every step past the objective. The long one goes to a
// replica that decodes fast, even though its first token comes later
// there. (Judged by the batch at send time alone, both went to slow: its
// TPOT then, 85 ms, is under the 100 ms objective.)
func TestPredictiveKeepsLongOutputsOffANearSLOReplica(t *testing.T) {
	c := newFakeClock()
	fast, slow := newReplica(t, "fast", c, replicaOpts{}), newReplica(t, "slow", c, replicaOpts{})
	teachDecode(t, fast, c, 200*time.Microsecond, 30*time.Millisecond, time.Millisecond)
	teachDecode(t, slow, c, 400*time.Microsecond, 70*time.Millisecond, 5*time.Millisecond)
	// fast has 11,000 prompt tokens queued (TTFT ≈ 2.4 s for a 1,000-token
	// prompt: over the 2 s objective); slow runs two requests (TPOT at
	// three: 85 ms) and its prompts are done.
	if _, err := fast.AcquireRequest(balancer.LeaseCost{PromptTokens: 11000}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := slow.AcquireRequest(balancer.LeaseCost{}); err != nil {
			t.Fatal(err)
		}
	}
	c.advance(time.Second)
	p, err := balancer.NewPicker("predictive")
	if err != nil {
		t.Fatal(err)
	}
	cands := []*balancer.Replica{slow, fast}
	for _, tc := range []struct {
		output int
		want   *balancer.Replica
	}{
		{20, slow},  // ~1.7 s of decode: under two requests join
		{400, fast}, // ~34 s: dozens join, TPOT far past 100 ms
	} {
		req := &balancer.Request{Now: c.now(), PromptTokens: 1000, OutputTokens: tc.output,
			SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond}
		if got := p.Pick(req, cands); got != tc.want {
			t.Errorf("%d output tokens: picked %s, want %s", tc.output, got.Name(), tc.want.Name())
		}
	}
}

// roomUnderWait is a Room that fits a replica while its queued prefill
// would take under half a second.
type roomUnderWait struct{}

func (roomUnderWait) FitsReplica(l balancer.ReplicaLoad, _, _ int) bool {
	return l.PrefillWait < 500*time.Millisecond
}

// When admission places a request and the only replica with room is
// predicted to miss its TPOT objective while one without room (its
// prefill queue over admission's limit) is predicted to meet both, the
// request goes to the latter: holding to the room rule there sent the
// conversation trace's long outputs to the half-speed replica, where
// most missed their TPOT objective.
func TestPredictiveRoomPassPrefersAReplicaMeetingTheSLO(t *testing.T) {
	c := newFakeClock()
	fast, slow := newReplica(t, "fast", c, replicaOpts{}), newReplica(t, "slow", c, replicaOpts{})
	teachDecode(t, fast, c, 200*time.Microsecond, 30*time.Millisecond, time.Millisecond)
	teachDecode(t, slow, c, 400*time.Microsecond, 140*time.Millisecond, 5*time.Millisecond)
	// fast: 3,000 tokens queued, 0.6 s of prefill: no room, yet a
	// 1,000-token prompt's first token in ≈ 0.8 s.
	if _, err := fast.AcquireRequest(balancer.LeaseCost{PromptTokens: 3000}); err != nil {
		t.Fatal(err)
	}
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: "predictive"}, []*balancer.Replica{slow, fast})
	if err != nil {
		t.Fatal(err)
	}
	req := &balancer.Request{Now: c.now(), PromptTokens: 1000, OutputTokens: 20,
		SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond, Room: roomUnderWait{}}
	if got := pool.Pick(req); got != fast {
		t.Errorf("picked %s, want fast (slow's TPOT ≈ 145 ms misses the 100 ms objective)", got.Name())
	}
	// With a TPOT objective slow meets, the room rule holds: slow.
	req.SLOTPOT = 200 * time.Millisecond
	if got := pool.Pick(req); got != slow {
		t.Errorf("TPOT objective 200 ms: picked %s, want slow (the replica with room)", got.Name())
	}
}
