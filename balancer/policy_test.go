package balancer_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
)

// pickCounts routes n requests through pool (releasing nothing unless
// release is set) and counts picks per replica name.
func pickCounts(t *testing.T, pool *balancer.Pool, n int, req func(i int) *balancer.Request, release bool) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		r := pool.Pick(req(i))
		if r == nil {
			t.Fatalf("pick %d: nil", i)
		}
		counts[r.Name()]++
		l, err := r.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		if release {
			l.Done(nil)
		}
	}
	return counts
}

func fixedReq(i int) *balancer.Request { return &balancer.Request{Now: t0} }

func newPoolT(t *testing.T, cfg balancer.PoolConfig, rs ...*balancer.Replica) *balancer.Pool {
	t.Helper()
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	p, err := balancer.NewPool(cfg, rs)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLeastLoadedUsesEngineTelemetry(t *testing.T) {
	c := newFakeClock()
	tests := []struct {
		name string
		a, b balancer.EngineLoad
		want string
	}{
		{"fewer running", balancer.EngineLoad{Running: 10, At: t0}, balancer.EngineLoad{Running: 3, At: t0}, "b"},
		{"waiting weighs more than running", balancer.EngineLoad{Running: 2, Waiting: 2, At: t0}, balancer.EngineLoad{Running: 8, At: t0}, "b"},
		{"KV pressure penalised", balancer.EngineLoad{Running: 4, KVUsage: 0.99, At: t0}, balancer.EngineLoad{Running: 8, KVUsage: 0.3, At: t0}, "b"},
		{"stale counts as saturated (fail closed)", balancer.EngineLoad{Running: 0, At: t0.Add(-time.Hour)}, balancer.EngineLoad{Running: 50, At: t0}, "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{})
			a.SetEngineLoad(tt.a)
			b.SetEngineLoad(tt.b)
			pool := newPoolT(t, balancer.PoolConfig{Policy: "least_loaded"}, a, b)
			for i := 0; i < 4; i++ { // ties rotate; a decided order doesn't
				if got := pool.Pick(fixedReq(0)); got.Name() != tt.want {
					t.Fatalf("picked %s, want %s", got.Name(), tt.want)
				}
			}
		})
	}
}

func TestStalePostureAndNeverIdle(t *testing.T) {
	c := newFakeClock()
	// A replica whose metrics went stale while it reported a huge queue
	// must not look idle; fail-open uses router counts instead.
	for _, failOpen := range []bool{false, true} {
		a, b := newReplica(t, "a", c, replicaOpts{inFlight: 1}), newReplica(t, "b", c, replicaOpts{inFlight: 3})
		a.SetEngineLoad(balancer.EngineLoad{Running: 0, At: t0.Add(-time.Minute)}) // stale, claims idle
		b.SetEngineLoad(balancer.EngineLoad{Running: 5, At: t0})
		pool := newPoolT(t, balancer.PoolConfig{Policy: "least_loaded", Picker: balancer.PickerOptions{Score: balancer.ScoreConfig{FailOpen: failOpen}}}, a, b)
		got := pool.Pick(fixedReq(0)).Name()
		want := map[bool]string{false: "b", true: "a"}[failOpen]
		if got != want {
			t.Errorf("failOpen=%v: picked %s, want %s", failOpen, got, want)
		}
	}
	// Every replica stale: still routable (least router in-flight wins).
	a, b := newReplica(t, "a", c, replicaOpts{inFlight: 4}), newReplica(t, "b", c, replicaOpts{inFlight: 1})
	a.SetEngineLoad(balancer.EngineLoad{At: t0.Add(-time.Minute)})
	b.SetEngineLoad(balancer.EngineLoad{At: t0.Add(-time.Minute)})
	if got := newPoolT(t, balancer.PoolConfig{Policy: "least_loaded"}, a, b).Pick(fixedReq(0)); got == nil || got.Name() != "b" {
		t.Errorf("all stale: picked %v, want b", got)
	}
}

func TestLeastLoadedCorrectsSnapshotWithRouterSends(t *testing.T) {
	c := newFakeClock()
	a, b := newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{})
	a.SetEngineLoad(balancer.EngineLoad{Running: 0, At: t0})
	b.SetEngineLoad(balancer.EngineLoad{Running: 3, At: t0})
	pool := newPoolT(t, balancer.PoolConfig{Policy: "least_loaded"}, a, b)
	// Between scrapes a looks idle; without the correction it would take
	// every request until the next scrape (herding).
	counts := pickCounts(t, pool, 10, fixedReq, false)
	if counts["a"] > 7 || counts["b"] < 3 {
		t.Errorf("picks %v: the router's sends since the scrape were ignored", counts)
	}
}

func TestKVAwarePrefersKVHeadroom(t *testing.T) {
	c := newFakeClock()
	a, b := newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{})
	a.SetEngineLoad(balancer.EngineLoad{Running: 2, KVUsage: 0.8, KVCapacityTokens: 100000, At: t0})
	b.SetEngineLoad(balancer.EngineLoad{Running: 6, KVUsage: 0.2, KVCapacityTokens: 100000, At: t0})
	pool := newPoolT(t, balancer.PoolConfig{Policy: "kv_aware"}, a, b)
	if got := pool.Pick(fixedReq(0)); got.Name() != "b" {
		t.Fatalf("picked %s, want b (more KV headroom)", got.Name())
	}
}

func TestLeastTokensIsLengthAware(t *testing.T) {
	c := newFakeClock()
	a, b := newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{})
	long, err := a.AcquireCost(10000) // one long request on a
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // three short ones on b: more requests, less work
		if _, err := b.AcquireCost(100); err != nil {
			t.Fatal(err)
		}
	}
	pool := newPoolT(t, balancer.PoolConfig{Policy: "least_tokens"}, a, b)
	if got := pool.Pick(fixedReq(0)); got.Name() != "b" {
		t.Fatalf("picked %s, want b (less outstanding work)", got.Name())
	}
	long.Progress(9990)
	if got := a.OutstandingTokens(); got != 10 {
		t.Fatalf("outstanding after progress = %d, want 10", got)
	}
	long.Done(nil)
	if got := a.OutstandingTokens(); got != 0 {
		t.Fatalf("outstanding after done = %d, want 0", got)
	}
	// Learned speed normalises: a replica twice as fast drains twice the work.
	a.ObserveDecode(201, 2*time.Second) // 100 tok/s
	b.ObserveDecode(201, 1*time.Second) // 200 tok/s
	if _, err := a.AcquireCost(250); err != nil {
		t.Fatal(err)
	}
	// a: 250/100 = 2.5 s; b: 300/200 = 1.5 s.
	if got := pool.Pick(fixedReq(0)); got.Name() != "b" {
		t.Fatalf("picked %s, want b (faster replica drains its work sooner)", got.Name())
	}
}

func TestP2CDeterministicWithInjectedRand(t *testing.T) {
	run := func() []string {
		c := newFakeClock()
		rs := []*balancer.Replica{newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{}), newReplica(t, "c", c, replicaOpts{}), newReplica(t, "d", c, replicaOpts{})}
		rng := rand.New(rand.NewPCG(1, 2))
		pool := newPoolT(t, balancer.PoolConfig{Policy: "p2c", Picker: balancer.PickerOptions{Rand: rng.IntN}}, rs...)
		var out []string
		for i := 0; i < 40; i++ {
			r := pool.Pick(fixedReq(i))
			r.Acquire()
			out = append(out, r.Name())
		}
		return out
	}
	a, b := run(), run()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("pick %d differs between identical seeded runs: %s vs %s", i, a[i], b[i])
		}
	}
	counts := map[string]int{}
	for _, n := range a {
		counts[n]++
	}
	for name, n := range counts {
		if n < 6 || n > 14 { // 40 picks over 4: p2c keeps loads close
			t.Errorf("p2c spread %v: %s has %d", counts, name, n)
		}
	}
}

func TestAffinityStickyWithBoundedLoad(t *testing.T) {
	for _, policy := range []string{"prefix_affinity", "session_affinity"} {
		t.Run(policy, func(t *testing.T) {
			c := newFakeClock()
			var rs []*balancer.Replica
			for _, n := range []string{"a", "b", "c", "d"} {
				rs = append(rs, newReplica(t, n, c, replicaOpts{}))
			}
			pool := newPoolT(t, balancer.PoolConfig{Policy: policy}, rs...)
			key := func(k int) *balancer.Request {
				return &balancer.Request{Now: t0, PrefixHash: uint64(k)*0x9e3779b97f4a7c15 | 1, AffinityKey: string(rune('A' + k))}
			}
			// Sticky: with releases (no load), a key always lands on one replica.
			for k := 0; k < 8; k++ {
				first := pool.Pick(key(k))
				for i := 0; i < 5; i++ {
					if got := pool.Pick(key(k)); got != first {
						t.Fatalf("key %d moved from %s to %s with no load", k, first.Name(), got.Name())
					}
				}
			}
			// Bounded: one hot key, never released: no replica above
			// ceil(1.25 × mean) at any point.
			for i := 1; i <= 200; i++ {
				r := pool.Pick(key(3))
				if _, err := r.Acquire(); err != nil {
					t.Fatal(err)
				}
				var maxLoad int64
				for _, x := range rs {
					maxLoad = max(maxLoad, x.InFlight())
				}
				bound := int64((1.25*float64(i) + 3) / 4) // ceil((1+ε)·total/n)
				if maxLoad > bound+1 {
					t.Fatalf("after %d picks a replica holds %d > bound %d", i, maxLoad, bound)
				}
			}
		})
	}
}

func TestGPUAwareness(t *testing.T) {
	c := newFakeClock()
	a, b := newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{})
	b.SetGPULoad(balancer.GPULoad{CapacityFactor: 0.5, At: t0}) // throttled to half
	pool := newPoolT(t, balancer.PoolConfig{Policy: "least_loaded"}, a, b)
	counts := pickCounts(t, pool, 300, fixedReq, false)
	ratio := float64(counts["b"]) / float64(counts["a"])
	if ratio < 0.4 || ratio > 0.6 {
		t.Errorf("throttled replica got %v of traffic vs %v (ratio %.2f, want ≈0.5)", counts["b"], counts["a"], ratio)
	}
	b.SetGPULoad(balancer.GPULoad{CapacityFactor: 1, Fault: true, At: t0}) // Xid
	for i := 0; i < 50; i++ {
		if r := pool.Pick(fixedReq(i)); r.Name() == "b" {
			t.Fatal("replica with a GPU fault was picked")
		}
	}
}

func TestArmsSharesOverrideAndStability(t *testing.T) {
	c := newFakeClock()
	a, b := newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{})
	pool := newPoolT(t, balancer.PoolConfig{Arms: []balancer.Arm{
		{Name: "ctl", Policy: "round_robin", Share: 3},
		{Name: "exp", Policy: "least_loaded", Share: 1},
	}}, a, b)
	counts := map[string]int{}
	for i := 0; i < 4000; i++ {
		req := &balancer.Request{Now: t0, ArmKey: "req-" + string(rune(i))}
		pool.Pick(req)
		counts[req.Arm]++
		again := &balancer.Request{Now: t0, ArmKey: req.ArmKey}
		pool.Pick(again)
		if again.Arm != req.Arm {
			t.Fatalf("same key assigned to %s then %s", req.Arm, again.Arm)
		}
	}
	if f := float64(counts["exp"]) / 4000; f < 0.22 || f > 0.28 {
		t.Errorf("exp share %.3f, want ≈0.25 (%v)", f, counts)
	}
	forced := &balancer.Request{Now: t0, ArmKey: "x", Arm: "exp"}
	pool.Pick(forced)
	if forced.Arm != "exp" {
		t.Errorf("header-forced arm became %s", forced.Arm)
	}
	if err := pool.SetArms([]balancer.Arm{{Name: "x", Policy: "nope", Share: 1}}); err == nil {
		t.Error("unknown arm policy accepted")
	}
	if got := len(pool.Arms()); got != 2 {
		t.Errorf("failed SetArms replaced arms: %d", got)
	}
}

func TestSinkFromPollerSnapshots(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "a", c, replicaOpts{})
	r.StoreEngine(&gpu.EngineStats{Running: 3, Waiting: 2, KVUsage: 0.5, KVCapacityTokens: 1000, At: t0})
	if e := r.EngineLoad(); e == nil || e.Running != 3 || e.Waiting != 2 || e.KVCapacityTokens != 1000 {
		t.Fatalf("engine load %+v", e)
	}
	tests := []struct {
		name       string
		gpus       []gpu.GPUStats
		at         time.Duration
		wantFactor float64
		wantFault  bool
	}{
		{"healthy", []gpu.GPUStats{{SMClockMHz: 1980, SMClockMaxMHz: 1980}}, 0, 1, false},
		{"thermal throttle at 60% clock", []gpu.GPUStats{{SMClockMHz: 1188, SMClockMaxMHz: 1980, ThrottleReasons: []string{"hw_thermal_slowdown"}}}, 0, 0.6, false},
		{"slowest of two GPUs", []gpu.GPUStats{{}, {ThrottleReasons: []string{"sw_power_cap"}}}, 0, 0.5, false},
		{"xid appears", []gpu.GPUStats{{XidErrors: 1}}, time.Second, 1, true},
		{"xid unchanged within hold", []gpu.GPUStats{{XidErrors: 1}}, 5 * time.Minute, 1, true},
		{"xid unchanged after hold", []gpu.GPUStats{{XidErrors: 1}}, 11 * time.Minute, 1, false},
	}
	for _, tt := range tests {
		r.StoreGPU(&gpu.GPUSnapshot{GPUs: tt.gpus, At: t0.Add(tt.at)})
		g := r.GPULoad()
		if g.Fault != tt.wantFault || g.CapacityFactor < tt.wantFactor-1e-9 || g.CapacityFactor > tt.wantFactor+1e-9 {
			t.Errorf("%s: %+v, want factor %v fault %v", tt.name, g, tt.wantFactor, tt.wantFault)
		}
	}
}

func TestLeastLoadedAvoidsReplicasInLongPrefill(t *testing.T) {
	c := newFakeClock()
	a, b := newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{})
	a.SetEngineLoad(balancer.EngineLoad{Running: 1, At: t0})
	b.SetEngineLoad(balancer.EngineLoad{Running: 4, At: t0})
	pool := newPoolT(t, balancer.PoolConfig{Policy: "least_loaded"}, a, b)
	if got := pool.Pick(fixedReq(0)); got.Name() != "a" {
		t.Fatalf("picked %s before any long prefill, want a", got.Name())
	}
	long, err := a.AcquireCostKV(2500, 10000, true) // a starts a 10k-token prefill
	if err != nil {
		t.Fatal(err)
	}
	if got := pool.Pick(fixedReq(0)); got.Name() != "b" {
		t.Fatalf("picked %s while a runs a long prefill, want b", got.Name())
	}
	long.PrefillDone()
	if got := pool.Pick(fixedReq(0)); got.Name() != "a" {
		t.Fatalf("picked %s after a's prefill finished, want a", got.Name())
	}
	if a.LongPrefills() != 0 || a.KVReserved() != 10000 {
		t.Fatalf("long prefills %d, kv reserved %d", a.LongPrefills(), a.KVReserved())
	}
	long.Done(nil)
	if a.KVReserved() != 0 {
		t.Fatalf("kv reserved %d after done", a.KVReserved())
	}
}
