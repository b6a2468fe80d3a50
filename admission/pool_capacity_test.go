package admission

import (
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

func TestPoolCapacityKeepsAShortLane(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	var reps []*balancer.Replica
	for _, u := range []string{"http://a:1", "http://b:1", "http://c:1"} {
		r, err := balancer.NewReplica(balancer.ReplicaConfig{URL: u}, balancer.BreakerConfig{}, clock)
		if err != nil {
			t.Fatal(err)
		}
		r.SetEngineLoad(balancer.EngineLoad{Running: 1, KVCapacityTokens: 1 << 20, At: now})
		reps = append(reps, r)
	}
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m"}, reps)
	if err != nil {
		t.Fatal(err)
	}
	c := &poolCapacity{pool: pool, sat: SaturationConfig{}, clock: fixedClock{now}}
	long := Cost{PromptTokens: 9000, OutputTokens: 100}
	short := Cost{PromptTokens: 200, OutputTokens: 100}

	if !c.Admissible(long) {
		t.Fatal("idle pool refused a long request")
	}
	l1, _ := reps[0].AcquireCostKV(2350, 9100, true)
	if !c.Admissible(long) {
		t.Fatal("second long refused with two replicas free of long prefills")
	}
	l2, _ := reps[1].AcquireCostKV(2350, 9100, true)
	if c.Admissible(long) {
		t.Fatal("a long request may not take the last replica free of long prefills")
	}
	if !c.Admissible(short) {
		t.Fatal("a short request must still be admitted")
	}
	l1.PrefillDone()
	if !c.Admissible(long) {
		t.Fatal("long refused after a prefill finished")
	}
	if got := (SaturationConfig{}).LongPrefillCap(long, 0); got != 1 {
		t.Fatalf("long-prefill cap %d, want 1", got)
	}
	if got := (SaturationConfig{}).LongPrefillCap(short, 0); got != 0 {
		t.Fatalf("short request got cap %d", got)
	}
	l1.Done(nil)
	l2.Done(nil)
	reps[1].SetEngineLoad(balancer.EngineLoad{Waiting: 3, At: now.Add(-time.Minute)}) // stale: saturated
	reps[0].SetEngineLoad(balancer.EngineLoad{Waiting: 2, At: now})                   // one report: may be requests waiting one step
	if !c.Admissible(short) {
		t.Fatal("a replica whose engine showed requests waiting in one report only (they may wait just for its next step) counted saturated")
	}
	reps[0].SetEngineLoad(balancer.EngineLoad{Waiting: 2, At: now})    // waiting in two reports running: saturated
	reps[2].SetEngineLoad(balancer.EngineLoad{KVUsage: 0.95, At: now}) // KV: saturated
	if c.Admissible(short) {
		t.Fatal("saturated pool admitted a request")
	}
	// Every replica down: waiting can't help, the request goes through to
	// be refused by the pick.
	for _, r := range reps {
		r.SetHealthy(false)
	}
	if !c.Admissible(short) || !c.Admissible(long) {
		t.Fatal("a pool with no replica up held a request back")
	}
}

// Stale telemetry saturates a replica while another has fresh numbers; when
// every replica is stale the pool is not stopped: requests are admitted
// against the router's own reservations and the last known KV capacity.
func TestPoolCapacityAllStaleFallsBackToRouterCounts(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	var reps []*balancer.Replica
	for _, u := range []string{"http://a:1", "http://b:1"} {
		r, err := balancer.NewReplica(balancer.ReplicaConfig{URL: u}, balancer.BreakerConfig{}, clock)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, r)
	}
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m"}, reps)
	if err != nil {
		t.Fatal(err)
	}
	c := &poolCapacity{pool: pool, sat: SaturationConfig{}, clock: fixedClock{now}}
	short := Cost{PromptTokens: 200, OutputTokens: 100}
	stale := balancer.EngineLoad{Waiting: 5, KVUsage: 0.99, KVCapacityTokens: 1000, At: now.Add(-time.Minute)}

	reps[0].SetEngineLoad(stale)
	reps[1].SetEngineLoad(balancer.EngineLoad{Waiting: 2, KVCapacityTokens: 1000, At: now})
	if c.Admissible(short) {
		t.Fatal("admitted with one replica stale and the other saturated by fresh numbers")
	}
	reps[1].SetEngineLoad(stale)
	if !c.Admissible(short) {
		t.Fatal("every replica stale stopped the pool")
	}
	var leases []balancer.Lease
	for _, r := range reps {
		l, err := r.AcquireCostKV(300, 900, false)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if c.Admissible(short) {
		t.Fatal("admitted past every stale replica's KV budget")
	}
	for _, l := range leases {
		l.Done(nil)
	}
}

// fixedClock is a Clock stopped at one instant; these tests set no timers.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time                        { return c.t }
func (c fixedClock) AfterFunc(time.Duration, func()) Timer { panic("no timers here") }

// The capacity answer runs under the controller's lock on every admission
// attempt: after the first call sizes its buffer it allocates nothing.
func TestPoolCapacityAllocatesNothing(t *testing.T) {
	now := time.Unix(1000, 0)
	var reps []*balancer.Replica
	for _, u := range []string{"http://a:1", "http://b:1", "http://c:1", "http://d:1"} {
		r, err := balancer.NewReplica(balancer.ReplicaConfig{URL: u}, balancer.BreakerConfig{}, func() time.Time { return now })
		if err != nil {
			t.Fatal(err)
		}
		r.SetEngineLoad(balancer.EngineLoad{Running: 3, Waiting: 1, KVCapacityTokens: 1 << 20, At: now})
		reps = append(reps, r)
	}
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m"}, reps)
	if err != nil {
		t.Fatal(err)
	}
	c := &poolCapacity{pool: pool, sat: SaturationConfig{MaxWaiting: 4}, clock: fixedClock{now}}
	cost := Cost{PromptTokens: 9000, OutputTokens: 100}
	c.Admissible(cost)
	if n := testing.AllocsPerRun(100, func() { c.Admissible(cost) }); n != 0 {
		t.Fatalf("Admissible allocates %.1f times per call", n)
	}
}
