package balancer_test

import (
	"fmt"
	"testing"

	"github.com/gpurouter/gpurouter/balancer"
)

// benchPool builds a pool of n replicas under policy with in-flight counts
// spread over 0..12 in a scrambled order, so least_request has to scan the
// whole set and its minimum is not at a fixed position.
func benchPool(tb testing.TB, policy string, n int) *balancer.Pool {
	tb.Helper()
	c := newFakeClock()
	rs := make([]*balancer.Replica, n)
	for i := range rs {
		rs[i] = newReplica(tb, fmt.Sprintf("r%d", i), c, replicaOpts{inFlight: (i*7 + 3) % 13})
	}
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: policy}, rs)
	if err != nil {
		tb.Fatal(err)
	}
	return pool
}

// BenchmarkPick is the cost of one routing decision through Pool.Pick, the
// path every request takes. Timing claims about pickers live here, not in
// pass/fail tests.
func BenchmarkPick(b *testing.B) {
	for _, policy := range balancer.Policies() {
		for _, n := range []int{4, 64, 1000} {
			b.Run(fmt.Sprintf("%s/%d", policy, n), func(b *testing.B) {
				pool := benchPool(b, policy, n)
				req := &balancer.Request{Now: t0, PrefixHash: 0x9e3779b97f4a7c15, AffinityKey: "session-42", ArmKey: "req-1"}
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
}
