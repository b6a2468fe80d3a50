package balancer_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// teach sends n requests of prompt tokens through r one at a time, each
// taking perToken·prompt + fixed to its first token on clock c, and tpot
// per output token over 10 tokens, ten seconds apart (so the replica's
// prefill is mostly idle: its decodes are not stretched).
func teach(t *testing.T, r *balancer.Replica, c *fakeClock, n int, prompt int64, perToken, fixed, tpot time.Duration) {
	t.Helper()
	for range n {
		l, err := r.AcquireRequest(balancer.LeaseCost{PromptTokens: prompt})
		if err != nil {
			t.Fatal(err)
		}
		c.advance(fixed + time.Duration(prompt)*perToken)
		l.PrefillDone()
		l.ObserveDecode(11, 10*tpot)
		l.Done(nil)
		c.advance(10 * time.Second)
	}
}

// The predictor learns each replica's prefill rate from the router's own
// TTFTs (no profile), and re-learns it when the replica slows down.
func TestPredictorLearnsAndAdapts(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "r", c, replicaOpts{})
	// Prompts of varied size, so the fixed cost and the rate both show.
	for _, p := range []int64{500, 2000, 4000, 1000, 8000, 3000} {
		teach(t, r, c, 3, p, 200*time.Microsecond, 20*time.Millisecond, 30*time.Millisecond)
	}
	st := r.Predictor()
	if math.Abs(st.TTFTPerToken-200e-6) > 2e-6 || math.Abs(st.TTFTFixedS-0.020) > 0.002 {
		t.Fatalf("learned TTFT ≈ %.4f s + %.2e s/token, want 0.020 + 2.00e-04", st.TTFTFixedS, st.TTFTPerToken)
	}
	if got := r.PredictTTFT(2500); math.Abs(got.Seconds()-0.52) > 0.01 {
		t.Errorf("PredictTTFT(2500) = %v, want ≈ 520ms", got)
	}
	// Predict (what a trace's pick records) says the same of an idle
	// replica, and the TPOT it learnt.
	if ttft, tpot := r.Predict(2500, c.now()); math.Abs(ttft.Seconds()-0.52) > 0.01 || math.Abs(tpot.Seconds()-0.030) > 0.005 {
		t.Errorf("Predict(2500) = %v, %v; want ≈ 520ms, 30ms", ttft, tpot)
	}
	// The replica halves its speed: within 60 requests the fit follows.
	for _, p := range []int64{500, 2000, 4000, 1000, 8000, 3000} {
		teach(t, r, c, 10, p, 400*time.Microsecond, 20*time.Millisecond, 30*time.Millisecond)
	}
	if st := r.Predictor(); math.Abs(st.TTFTPerToken-400e-6)/400e-6 > 0.05 {
		t.Errorf("after slowing down: %.2e s/token, want ≈ 4.00e-04 (within 5%%)", st.TTFTPerToken)
	}
	if st := r.Predictor(); st.PrefillQueuedTokens != 0 {
		t.Errorf("queued prefill %d after every request ended, want 0", st.PrefillQueuedTokens)
	}
}

// The predictive policy sends a request where its first token comes
// soonest — a half-speed replica gets it only while the full-speed one's
// queued prefill would take longer — and picks for the request's own SLO.
func TestPredictivePicksByPredictedTTFT(t *testing.T) {
	c := newFakeClock()
	fast, slow := newReplica(t, "fast", c, replicaOpts{}), newReplica(t, "slow", c, replicaOpts{})
	for _, p := range []int64{500, 2000, 4000, 1000} {
		teach(t, fast, c, 3, p, 200*time.Microsecond, 10*time.Millisecond, 30*time.Millisecond)
		teach(t, slow, c, 3, p, 400*time.Microsecond, 10*time.Millisecond, 30*time.Millisecond)
	}
	p, err := balancer.NewPicker("predictive")
	if err != nil {
		t.Fatal(err)
	}
	req := &balancer.Request{Now: c.now(), PromptTokens: 2000}
	cands := []*balancer.Replica{slow, fast}
	if got := p.Pick(req, cands); got != fast {
		t.Fatalf("both idle: picked %s, want fast", got.Name())
	}
	// 3,000 tokens queued on fast: 0.01 + 5000·200µs = 1.01 s there
	// against 0.01 + 2000·400µs = 0.81 s on the idle slow one.
	if _, err := fast.AcquireRequest(balancer.LeaseCost{PromptTokens: 3000}); err != nil {
		t.Fatal(err)
	}
	if got := p.Pick(req, cands); got != slow {
		t.Errorf("fast has 3000 tokens queued: picked %s, want slow", got.Name())
	}
}

// The request's own SLOs decide between a replica that would start it
// sooner and one whose batch decodes faster.
func TestPredictivePicksForTheRequestsSLO(t *testing.T) {
	c := newFakeClock()
	fast, slow := newReplica(t, "fast", c, replicaOpts{}), newReplica(t, "slow", c, replicaOpts{})
	for _, p := range []int64{500, 2000, 4000, 1000} {
		teach(t, fast, c, 3, p, 200*time.Microsecond, 10*time.Millisecond, 30*time.Millisecond)
		teach(t, slow, c, 3, p, 400*time.Microsecond, 10*time.Millisecond, 150*time.Millisecond)
	}
	if _, err := fast.AcquireRequest(balancer.LeaseCost{PromptTokens: 3000}); err != nil {
		t.Fatal(err)
	}
	p, err := balancer.NewPicker("predictive")
	if err != nil {
		t.Fatal(err)
	}
	cands := []*balancer.Replica{fast, slow}
	// fast: TTFT 1.01 s, TPOT 60 ms (two in flight); slow: 0.81 s, 150 ms.
	for _, tc := range []struct {
		tpot time.Duration
		want *balancer.Replica
	}{
		{200 * time.Millisecond, slow}, // only slow meets both
		{100 * time.Millisecond, fast}, // each misses one: fast misses by less
	} {
		req := &balancer.Request{Now: c.now(), PromptTokens: 2000, SLOTTFT: 900 * time.Millisecond, SLOTPOT: tc.tpot}
		if got := p.Pick(req, cands); got != tc.want {
			t.Errorf("SLO TTFT 900ms, TPOT %v: picked %s, want %s", tc.tpot, got.Name(), tc.want.Name())
		}
	}
}

// roomAll is a Room that admits everywhere but still reads the load.
type roomAll struct{}

func (roomAll) FitsReplica(l balancer.ReplicaLoad, _, _ int, _ time.Duration) bool {
	return l.PrefillWait >= 0
}

// BenchmarkPredictivePickLearned is the predictive policy's decision with
// every replica's fits learned, prefill queued and admission's Room
// applied: the path a request takes in a busy pool. It must not allocate.
func BenchmarkPredictivePickLearned(b *testing.B) {
	for _, n := range []int{4, 64} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			c := newFakeClock()
			rs := make([]*balancer.Replica, n)
			for i := range rs {
				rs[i] = newReplica(b, fmt.Sprintf("r%d", i), c, replicaOpts{})
				for k := range 12 {
					l, _ := rs[i].AcquireRequest(balancer.LeaseCost{PromptTokens: int64(500 + 300*k)})
					c.advance(time.Duration(500+300*k) * time.Duration(100+20*(i%5)) * time.Microsecond)
					l.PrefillDone()
					l.ObserveDecode(20, 19*30*time.Millisecond)
					l.Done(nil)
				}
				rs[i].AcquireRequest(balancer.LeaseCost{PromptTokens: int64((i * 977) % 4000)}) //nolint:errcheck // held: queued prefill
			}
			pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: "predictive"}, rs)
			if err != nil {
				b.Fatal(err)
			}
			req := &balancer.Request{Now: c.now(), PromptTokens: 2000, OutputTokens: 100, Room: roomAll{}}
			b.ReportAllocs()
			var picked *balancer.Replica
			for b.Loop() {
				picked = pool.Pick(req)
			}
			if picked == nil {
				b.Fatal("no pick")
			}
		})
	}
}

// A request the engine holds in its waiting queue (KV cache full) waits
// longer than its prefill: the predictor learns that from the engine's
// reported queue, and the policy then avoids a replica whose engine has
// requests waiting, as fast as it otherwise is.
func TestPredictorLearnsEngineQueueWait(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "r", c, replicaOpts{})
	for _, p := range []int64{500, 2000, 4000, 1000, 8000, 3000} {
		teach(t, r, c, 3, p, 200*time.Microsecond, 10*time.Millisecond, 30*time.Millisecond)
	}
	// Two requests wait in the engine: each one sent now waits 2 × 500 ms
	// more than its prefill.
	for _, p := range []int64{500, 2000, 4000, 1000, 8000, 3000} {
		for range 5 {
			r.SetEngineLoad(balancer.EngineLoad{Running: 4, Waiting: 2, At: c.now()})
			l, err := r.AcquireRequest(balancer.LeaseCost{PromptTokens: p})
			if err != nil {
				t.Fatal(err)
			}
			c.advance(10*time.Millisecond + time.Duration(p)*200*time.Microsecond + time.Second)
			l.PrefillDone()
			l.Done(nil)
		}
	}
	st := r.Predictor()
	if math.Abs(st.EngineWaitPerRequestS-0.5) > 0.05 {
		t.Errorf("learned %.3f s per waiting request, want ≈ 0.5", st.EngineWaitPerRequestS)
	}
	if math.Abs(st.TTFTPerToken-200e-6)/200e-6 > 0.05 {
		t.Errorf("prefill fit %.2e s/token after the queued requests, want ≈ 2.00e-04", st.TTFTPerToken)
	}

	// A second replica as fast with an empty engine queue wins.
	other := newReplica(t, "other", c, replicaOpts{})
	for _, p := range []int64{500, 2000, 4000, 1000, 8000, 3000} {
		teach(t, other, c, 3, p, 200*time.Microsecond, 10*time.Millisecond, 30*time.Millisecond)
	}
	r.SetEngineLoad(balancer.EngineLoad{Running: 4, Waiting: 2, At: c.now()})
	other.SetEngineLoad(balancer.EngineLoad{Running: 4, At: c.now()})
	p, err := balancer.NewPicker("predictive")
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if got := p.Pick(&balancer.Request{Now: c.now(), PromptTokens: 1000}, []*balancer.Replica{r, other}); got != other {
			t.Fatalf("picked %s, want other (r has 2 waiting in its engine)", got.Name())
		}
	}
}

// BenchmarkObserveGap is what each output chunk of a stream costs the
// replica's predictor: its live inter-token latency (liveITL). It must
// not allocate.
func BenchmarkObserveGap(b *testing.B) {
	// "headroom": the request's output is known, so each gap also
	// reports its decode headroom (headroom.go).
	for _, output := range []int64{0, 1 << 40} {
		name := "itl"
		if output > 0 {
			name = "headroom"
		}
		b.Run(name, func(b *testing.B) {
			c := newFakeClock()
			r := newReplica(b, "r", c, replicaOpts{})
			l, err := r.AcquireRequest(balancer.LeaseCost{OutputTokens: output, TPOTObjective: 100 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			now := c.now()
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(50 * time.Millisecond)
				l.ObserveGap(50*time.Millisecond, now)
			}
			l.Done(nil)
		})
	}
}
