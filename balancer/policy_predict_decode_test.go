package balancer_test

import (
	"math"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// teachDecode teaches r's TTFT fit (prefill perToken, 10 ms fixed) and a
// TPOT fit of fixed + perRequest·(requests in flight), sending requests
// ten seconds apart (its prefill mostly idle: nothing stretches the
// decodes) with 0–3 others held in flight, so both fits have a slope.
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
		c.advance(10*time.Second - 10*time.Millisecond - time.Duration(prompt)*perToken)
	}
}

// The step fit learns a decode's own step, not the prefills that ran in
// it: a request that decoded while 5,000 prompt tokens were sent to its
// replica (1 s of prefill at 200 µs a token) took 1 s longer, and the fit
// takes that second out.
func TestPredictorLearnsTheStepLessThePrefillsDuringIt(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "r", c, replicaOpts{})
	teach(t, r, c, 12, 1000, 200*time.Microsecond, 10*time.Millisecond, 40*time.Millisecond)
	for range 12 {
		l, err := r.AcquireRequest(balancer.LeaseCost{PromptTokens: 1000})
		if err != nil {
			t.Fatal(err)
		}
		c.advance(210 * time.Millisecond)
		l.PrefillDone()
		for range 5 { // placed while it decodes
			o, err := r.AcquireRequest(balancer.LeaseCost{PromptTokens: 1000})
			if err != nil {
				t.Fatal(err)
			}
			o.Done(nil)
		}
		l.ObserveDecode(51, 50*40*time.Millisecond+time.Second) // 60 ms a token, 40 without the prefills
		l.Done(nil)
		c.advance(time.Minute)
	}
	if st := r.Predictor(); math.Abs(st.TPOTFixedS+st.TPOTPerRequest-0.040) > 0.002 {
		t.Errorf("learned step %.1f ms + %.2f ms/request, want ≈ 40 ms (the 20 ms the prefills added taken out)",
			st.TPOTFixedS*1000, st.TPOTPerRequest*1000)
	}
}

// A replica whose prefill is kept busy by the prompts arriving there
// stretches every decode there: with prompts arriving at 70% of its
// prefill speed, a 70 ms step becomes 233 ms, and a TPOT-bound request
// goes to a replica that decodes slower per step but prefills little —
// and back once the prompts stop.
func TestPredictiveKeepsDecodesOffAReplicaBusyPrefilling(t *testing.T) {
	c := newFakeClock()
	busy, calm := newReplica(t, "busy", c, replicaOpts{}), newReplica(t, "calm", c, replicaOpts{})
	teachDecode(t, busy, c, 200*time.Microsecond, 70*time.Millisecond, 0)
	teachDecode(t, calm, c, 200*time.Microsecond, 90*time.Millisecond, 0)
	// 3,500 prompt tokens a second on busy (0.7 s of prefill each second),
	// long enough for its arrival rate to show.
	for range 40 {
		l, err := busy.AcquireRequest(balancer.LeaseCost{PromptTokens: 3500})
		if err != nil {
			t.Fatal(err)
		}
		c.advance(10*time.Millisecond + 700*time.Millisecond)
		l.PrefillDone()
		l.Done(nil)
		c.advance(290 * time.Millisecond)
	}
	if st := busy.Predictor(); st.PrefillLoad < 0.4 {
		t.Fatalf("busy's predicted prefill load %.2f, want ≈ 0.5 (0.7, smoothed over its last requests)", st.PrefillLoad)
	}
	p, err := balancer.NewPicker("predictive")
	if err != nil {
		t.Fatal(err)
	}
	req := &balancer.Request{Now: c.now(), PromptTokens: 200, OutputTokens: 100,
		SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond}
	cands := []*balancer.Replica{busy, calm}
	for range 3 {
		if got := p.Pick(req, cands); got != calm {
			t.Fatalf("prompts arriving at 0.7 of busy's prefill speed: picked %s, want calm", got.Name())
		}
	}
	c.advance(5 * time.Minute) // the prompts stopped
	req.Now = c.now()
	if st := busy.Predictor(); st.PrefillLoad > 0.05 {
		t.Errorf("five minutes after the prompts stopped: busy's prefill load %.2f, want ≈ 0", st.PrefillLoad)
	}
	picked := map[*balancer.Replica]int{}
	for range 4 { // both meet the objectives again: they share by load
		got := p.Pick(req, cands)
		if _, err := got.Acquire(); err != nil {
			t.Fatal(err)
		}
		picked[got]++
	}
	if picked[busy] != 2 {
		t.Errorf("after the prompts stopped: busy picked %d of 4, want 2", picked[busy])
	}
}

// What the router sees streaming from a replica now counts before the
// model: a replica whose streams arrive 150 ms apart is predicted to miss
// a 100 ms TPOT objective whatever its step fit says, and a second
// without output ends that.
func TestPredictiveReadsTheLiveInterTokenLatency(t *testing.T) {
	c := newFakeClock()
	slow, fast := newReplica(t, "slow", c, replicaOpts{}), newReplica(t, "fast", c, replicaOpts{})
	teachDecode(t, slow, c, 200*time.Microsecond, 30*time.Millisecond, 0)
	teachDecode(t, fast, c, 200*time.Microsecond, 60*time.Millisecond, 0)
	l, err := slow.AcquireRequest(balancer.LeaseCost{PromptTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	l.PrefillDone()
	for range 40 {
		c.advance(150 * time.Millisecond)
		l.ObserveGap(150*time.Millisecond, c.now())
	}
	if st := slow.Predictor(); math.Abs(st.LiveITLS-0.150) > 0.001 {
		t.Fatalf("live ITL %.1f ms, want 150", st.LiveITLS*1000)
	}
	p, err := balancer.NewPicker("predictive")
	if err != nil {
		t.Fatal(err)
	}
	req := &balancer.Request{Now: c.now(), PromptTokens: 100, OutputTokens: 50,
		SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond}
	if got := p.Pick(req, []*balancer.Replica{slow, fast}); got != fast {
		t.Errorf("slow streams 150 ms apart: picked %s, want fast", got.Name())
	}
	if load := slowLoad(slow, c); load.ITL != 150*time.Millisecond {
		t.Errorf("admission's load shows ITL %v, want 150ms", load.ITL)
	}
	c.advance(1100 * time.Millisecond)
	if st := slow.Predictor(); st.LiveITLS != 0 {
		t.Errorf("a second after its last output: live ITL %.1f ms, want 0", st.LiveITLS*1000)
	}
	l.Done(nil)
}

// streams holds leases on one replica that stream (no prompt size given,
// so the prefill predictor is left alone): gap has each see a gap of d
// now; step advances the clock by d and does that, n times; done ends
// them.
type streams struct {
	c      *fakeClock
	leases []balancer.Lease
}

func newStreams(t *testing.T, r *balancer.Replica, c *fakeClock, n int) *streams {
	t.Helper()
	s := &streams{c: c}
	for range n {
		l, err := r.AcquireRequest(balancer.LeaseCost{})
		if err != nil {
			t.Fatal(err)
		}
		s.leases = append(s.leases, l)
	}
	return s
}

func (s *streams) gap(d time.Duration) {
	for _, l := range s.leases {
		l.ObserveGap(d, s.c.now())
	}
}

func (s *streams) step(d time.Duration, n int) {
	for range n {
		s.c.advance(d)
		s.gap(d)
	}
}

func (s *streams) done() {
	for _, l := range s.leases {
		l.Done(nil)
	}
}

// The live ITL averages about a second of a replica's steps whatever its
// batch: twenty streams yield twenty gaps a step, and one prefill stall
// among them must not read as the replica's ITL (with a fixed weight per
// gap it did: 50 ms steps and one 180 ms stall gave ~133 ms with twenty
// streams, ~62 ms with two). A slowdown that lasts does show within the
// second, at either size.
func TestLiveITLAveragesASecondWhateverTheBatch(t *testing.T) {
	for _, n := range []int{2, 20} {
		c := newFakeClock()
		r := newReplica(t, "r", c, replicaOpts{})
		s := newStreams(t, r, c, n)
		s.step(50*time.Millisecond, 40)
		s.step(180*time.Millisecond, 1) // one prefill stalls every stream once
		if got := r.Predictor().LiveITLS; got > 0.070 {
			t.Errorf("%d streams, 50 ms steps and one 180 ms stall: live ITL %.0f ms, want ≤ 70", n, got*1000)
		}
		s.step(150*time.Millisecond, 10) // 1.5 s of slow steps
		if got := r.Predictor().LiveITLS; got < 0.100 {
			t.Errorf("%d streams after 1.5 s of 150 ms steps: live ITL %.0f ms, want ≥ 100", n, got*1000)
		}
		s.done()
	}
}

// A long generation goes where it decodes fastest over its life, not
// where the last step was short: a full-speed replica streaming twenty
// requests at 50 ms whose last step a prefill stalled (180 ms) against a
// half-speed one streaming two at 78 ms. Predicted from the stalled step,
// the full-speed replica missed the TPOT objective and the half-speed one
// took the 400 tokens, to finish ~10 s later.
func TestPredictiveLooksPastOneStalledStep(t *testing.T) {
	c := newFakeClock()
	fast, slow := newReplica(t, "fast", c, replicaOpts{}), newReplica(t, "slow", c, replicaOpts{})
	teachDecode(t, fast, c, 200*time.Microsecond, 30*time.Millisecond, time.Millisecond)
	teachDecode(t, slow, c, 400*time.Microsecond, 70*time.Millisecond, 3*time.Millisecond)
	fs, ss := newStreams(t, fast, c, 20), newStreams(t, slow, c, 2)
	for range 40 { // both stream, each at its own step
		fs.step(50*time.Millisecond, 1)
		ss.gap(78 * time.Millisecond)
	}
	fs.step(180*time.Millisecond, 1)
	ss.gap(78 * time.Millisecond)
	p, err := balancer.NewPicker("predictive")
	if err != nil {
		t.Fatal(err)
	}
	req := &balancer.Request{Now: c.now(), PromptTokens: 1000, OutputTokens: 400,
		SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond}
	if got := p.Pick(req, []*balancer.Replica{slow, fast}); got != fast {
		t.Errorf("400 output tokens, fast's last step stalled: picked %s, want fast", got.Name())
	}
	fs.done()
	ss.done()
}

// slowLoad is r's entry in its pool's admission loads at c's now.
func slowLoad(r *balancer.Replica, c *fakeClock) balancer.ReplicaLoad {
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m"}, []*balancer.Replica{r})
	if err != nil {
		panic(err)
	}
	return pool.Loads(c.now(), nil)[0]
}

// roomUnderWait is a Room that fits a replica while its queued prefill
// would take under half a second.
type roomUnderWait struct{}

func (roomUnderWait) FitsReplica(l balancer.ReplicaLoad, _, _ int, _ time.Duration) bool {
	return l.PrefillWait < 500*time.Millisecond
}

// roomPassPool is the room-pass tests' pool: fast (prefill 200 µs a
// token, decode 30 ms + 1 ms a request) with 3,000 prompt tokens queued —
// 0.6 s of prefill: out of room under a half-second prefill limit, yet a
// 1,000-token prompt's first token in ≈ 0.8 s — and an idle slow one
// (400 µs, 140 ms + 5 ms: TPOT ≈ 145 ms); and a 1,000-token request with
// objectives 2 s / 100 ms placed under room.
func roomPassPool(t *testing.T, room balancer.Room) (pool *balancer.Pool, fast, slow *balancer.Replica, req *balancer.Request) {
	t.Helper()
	c := newFakeClock()
	fast, slow = newReplica(t, "fast", c, replicaOpts{}), newReplica(t, "slow", c, replicaOpts{})
	teachDecode(t, fast, c, 200*time.Microsecond, 30*time.Millisecond, time.Millisecond)
	teachDecode(t, slow, c, 400*time.Microsecond, 140*time.Millisecond, 5*time.Millisecond)
	if _, err := fast.AcquireRequest(balancer.LeaseCost{PromptTokens: 3000}); err != nil {
		t.Fatal(err)
	}
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: "predictive"}, []*balancer.Replica{slow, fast})
	if err != nil {
		t.Fatal(err)
	}
	req = &balancer.Request{Now: c.now(), PromptTokens: 1000, OutputTokens: 20,
		SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond, Room: room}
	return pool, fast, slow, req
}

// When admission places a request and the only replica with room is
// predicted to miss its TPOT objective while one without room (its
// prefill queue over admission's limit) is predicted to meet both, the
// request goes to the latter: holding to the room rule there sent the
// conversation trace's long outputs to the half-speed replica, where
// most missed their TPOT objective.
func TestPredictiveRoomPassPrefersAReplicaMeetingTheSLO(t *testing.T) {
	pool, fast, slow, req := roomPassPool(t, roomUnderWait{})
	if got := pool.Pick(req); got != fast {
		t.Errorf("picked %s, want fast (slow's TPOT ≈ 145 ms misses the 100 ms objective)", got.Name())
	}
	// With a TPOT objective slow meets, the room rule holds: slow.
	req.SLOTPOT = 200 * time.Millisecond
	if got := pool.Pick(req); got != slow {
		t.Errorf("TPOT objective 200 ms: picked %s, want slow (the replica with room)", got.Name())
	}
}

// roomKVOrWait is a Room that fits a replica while its KV cache is under
// 90% and its queued prefill would take under half a second.
type roomKVOrWait struct{}

func (roomKVOrWait) FitsReplica(l balancer.ReplicaLoad, _, _ int, _ time.Duration) bool {
	return l.KVUsage < 0.9 && l.PrefillWait < 500*time.Millisecond
}

// The room pass's second look passes over a replica's queued prefill
// only: a replica whose KV cache is full stays out of it, however good its
// predictions (they see KV exhaustion only at the next scrape, and a
// request placed there waits in the engine's queue for KV to free).
func TestPredictiveRoomPassKeepsOffAReplicaOutOfKV(t *testing.T) {
	pool, fast, slow, req := roomPassPool(t, roomKVOrWait{})
	fast.SetEngineLoad(balancer.EngineLoad{Running: 1, KVUsage: 0.5, At: req.Now})
	if got := pool.Pick(req); got != fast {
		t.Fatalf("fast out of room for its prefill queue only: picked %s, want fast", got.Name())
	}
	fast.SetEngineLoad(balancer.EngineLoad{Running: 1, KVUsage: 0.95, At: req.Now})
	if got := pool.Pick(req); got != slow {
		t.Errorf("fast's KV cache 95%% full: picked %s, want slow (the replica with room)", got.Name())
	}
}
