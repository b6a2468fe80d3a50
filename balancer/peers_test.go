package balancer_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// scrapeEvery is the poller's default interval, which these tests imitate.
const scrapeEvery = 200 * time.Millisecond

// report stores an engine report on r at the clock's now: running and
// waiting requests and the cumulative finished count.
func report(r *balancer.Replica, c *fakeClock, running, waiting int, finished uint64) {
	r.SetEngineLoad(balancer.EngineLoad{Running: running, Waiting: waiting, RequestsFinished: finished,
		FinishedKnown: true, At: c.now()})
}

// With one router every request the engine receives is one the router
// sent, so the estimate of other routers' traffic stays 0 — also when a
// request the router has sent reaches the engine only after the scrape
// (the engine counts it one interval late), and when a request fails
// before reaching the engine at all.
func TestPeerTrafficOneRouter(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "a", c, replicaOpts{})
	report(r, c, 0, 0, 0)
	check := func(step string) {
		t.Helper()
		if o := r.EngineLoad().OthersPerS; o != 0 {
			t.Fatalf("%s: others' rate %v, want 0", step, o)
		}
	}
	var leases []balancer.Lease
	for range 3 {
		l, err := r.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	c.advance(scrapeEvery)
	report(r, c, 2, 0, 0) // the third is still on its way
	check("a send not yet counted by the engine")
	c.advance(scrapeEvery)
	report(r, c, 3, 0, 0) // now it is
	check("the late request arrives")
	for _, l := range leases {
		l.Done(nil)
	}
	c.advance(scrapeEvery)
	report(r, c, 0, 0, 3)
	check("all finish")
	// One fails before the engine sees it (connection refused): a deficit
	// no later arrival makes up, dropped once the request is over.
	l, err := r.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	l.Done(nil)
	c.advance(scrapeEvery)
	report(r, c, 0, 0, 3)
	check("a request lost on the way")
	// From here on the engine receives requests this router did not send:
	// they count in full, none absorbed by the lost request.
	for i := range uint64(10) {
		c.advance(scrapeEvery)
		report(r, c, 0, 0, 3+2*(i+1))
		// The first interval's two arrivals move the EWMA (τ = 1 s) by
		// (1−e^−0.2)·10/s ≈ 1.8/s; one absorbed would leave 0.9.
		if o := r.EngineLoad().OthersPerS; i == 0 && (o < 1.7 || o > 1.9) {
			t.Fatalf("first interval of others' traffic: %v, want ≈ 1.8/s", o)
		}
	}
	if o := r.EngineLoad().OthersPerS; o < 6 || o > 10 {
		t.Fatalf("others send 10/s: estimated %v", o)
	}
}

// An engine that does not report finished requests, or whose counter goes
// back (a restart), gives no estimate or keeps the last one: never a
// negative or an inflated rate.
func TestPeerTrafficUnknownOrReset(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "a", c, replicaOpts{})
	for i := range 5 {
		r.SetEngineLoad(balancer.EngineLoad{Running: 3 * i, At: c.now()})
		c.advance(scrapeEvery)
	}
	if o := r.EngineLoad().OthersPerS; o != 0 {
		t.Fatalf("no finished counter: others' rate %v", o)
	}
	fin := uint64(100)
	for range 5 {
		report(r, c, 2, 0, fin)
		fin += 2
		c.advance(scrapeEvery)
	}
	before := r.EngineLoad().OthersPerS
	report(r, c, 0, 0, 0) // restarted
	if o := r.EngineLoad().OthersPerS; o != before || o <= 0 {
		t.Fatalf("after a counter reset: %v, want the rate before (%v)", o, before)
	}
}

// othersFleet returns two replicas whose last reports are the same (4
// running), where b has been receiving 10 requests a second from other
// routers and a none; both last scraped at the clock's now.
func othersFleet(t *testing.T, c *fakeClock, teach func(a, b *balancer.Replica)) (a, b *balancer.Replica) {
	t.Helper()
	a, b = newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{})
	if teach != nil {
		teach(a, b)
	}
	for i := range uint64(15) {
		report(a, c, 4, 0, 0)
		report(b, c, 4, 0, 2*i) // two arrived and two finished each interval
		c.advance(scrapeEvery)
	}
	report(a, c, 4, 0, 0)
	report(b, c, 4, 0, 30)
	if o := b.EngineLoad().OthersPerS; o < 7 || o > 10 {
		t.Fatalf("b: others' rate %v, want near 10/s", o)
	}
	return a, b
}

// least_loaded: right after the scrape the two replicas tie; the longer
// since it, the more requests the other routers have sent to b, and a
// wins every pick.
func TestLeastLoadedCountsOthersSinceScrape(t *testing.T) {
	c := newFakeClock()
	a, b := othersFleet(t, c, nil)
	p, err := balancer.NewPicker("least_loaded")
	if err != nil {
		t.Fatal(err)
	}
	cands := []*balancer.Replica{a, b}
	got := countPicks(t, p, &balancer.Request{Now: c.now()}, cands, 100, false)
	if got["a"] != 50 || got["b"] != 50 {
		t.Fatalf("at the scrape: %v, want a tie", got)
	}
	got = countPicks(t, p, &balancer.Request{Now: c.now().Add(300 * time.Millisecond)}, cands, 100, false)
	if got["a"] != 100 {
		t.Fatalf("300 ms after the scrape: %v, want a every time", got)
	}
}

// teachPrefill teaches every replica the same prefill rate (200 µs a
// token, 10 ms fixed) and a mean prompt near 1,000 tokens.
func teachPrefill(t *testing.T, c *fakeClock, rs ...*balancer.Replica) {
	t.Helper()
	for i := range 8 {
		prompt := int64(250 + 500*(i%4))
		for _, r := range rs {
			l, err := r.AcquireRequest(balancer.LeaseCost{PromptTokens: prompt})
			if err != nil {
				t.Fatal(err)
			}
			c.advance(10*time.Millisecond + time.Duration(prompt)*200*time.Microsecond)
			l.PrefillDone()
			l.Done(nil)
		}
	}
}

// predictive: the other routers' expected sends to b since the scrape
// queue prefill there (at b's mean prompt), so a — the same replica
// otherwise — wins once enough time has passed.
func TestPredictiveCountsOthersSinceScrape(t *testing.T) {
	c := newFakeClock()
	a, b := othersFleet(t, c, func(a, b *balancer.Replica) { teachPrefill(t, c, a, b) })
	p, err := balancer.NewPicker("predictive")
	if err != nil {
		t.Fatal(err)
	}
	cands := []*balancer.Replica{a, b}
	req := &balancer.Request{Now: c.now(), PromptTokens: 1000}
	got := countPicks(t, p, req, cands, 100, false)
	if got["a"] != 50 || got["b"] != 50 {
		t.Fatalf("at the scrape: %v, want a tie", got)
	}
	req.Now = c.now().Add(300 * time.Millisecond)
	got = countPicks(t, p, req, cands, 100, false)
	if got["a"] != 100 {
		t.Fatalf("300 ms after the scrape: %v, want a every time", got)
	}
}

// predictive with NearEqual: at random among the replicas predicted within
// the cost of that many requests of the best (b: one 1,000-token prompt
// queued), never one further (c: ten), uniformly; off, always the best.
// Neither allocates.
func TestPredictiveNearEqual(t *testing.T) {
	c := newFakeClock()
	ra, rb, rc := newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{}), newReplica(t, "c", c, replicaOpts{})
	teachPrefill(t, c, ra, rb, rc)
	if _, err := rb.AcquireRequest(balancer.LeaseCost{PromptTokens: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.AcquireRequest(balancer.LeaseCost{PromptTokens: 10000}); err != nil {
		t.Fatal(err)
	}
	cands := []*balancer.Replica{ra, rb, rc}
	req := &balancer.Request{Now: c.now(), PromptTokens: 1000}
	for _, tt := range []struct {
		name string
		near float64
		want map[string]bool
	}{
		{"off", 0, map[string]bool{"a": true}},
		{"within two requests", 2, map[string]bool{"a": true, "b": true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(7, 7))
			p, err := balancer.NewPickerWith("predictive", balancer.PickerOptions{
				Score: balancer.ScoreConfig{NearEqual: tt.near}, Rand: rnd.IntN})
			if err != nil {
				t.Fatal(err)
			}
			got := countPicks(t, p, req, cands, 2000, false)
			for name, n := range got {
				if !tt.want[name] {
					t.Fatalf("picked %s %d times: %v", name, n, got)
				}
			}
			for name := range tt.want {
				if share := float64(got[name]) / 2000; share < 0.8/float64(len(tt.want)) {
					t.Fatalf("%s got %.0f%% of the picks: %v", name, 100*share, got)
				}
			}
			if n := testing.AllocsPerRun(100, func() { p.Pick(req, cands) }); n != 0 {
				t.Fatalf("%v allocs per Pick", n)
			}
		})
	}
}
