//go:build !race

// The race detector allocates on its own account, so allocation counts are
// only meaningful without it.

package balancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// TestPickAllocs holds Pool.Pick to the Picker contract: no allocation on
// the path every request takes, whatever the policy and whatever state the
// replicas are in.
func TestPickAllocs(t *testing.T) {
	states := []struct {
		name    string
		opts    func(i int) replicaOpts
		zeroNow bool
	}{
		{name: "varied load", opts: func(i int) replicaOpts { return replicaOpts{inFlight: i % 5, weight: float64(1 + i%3)} }},
		{name: "some unavailable", opts: func(i int) replicaOpts { return replicaOpts{down: i%3 == 0, open: i%3 == 1} }},
		{name: "none available", opts: func(int) replicaOpts { return replicaOpts{down: true} }},
		// A zero Request.Now makes Available read the replica's clock.
		{name: "open breakers, zero Now", opts: func(i int) replicaOpts { return replicaOpts{open: i%2 == 0} }, zeroNow: true},
	}
	for _, policy := range balancer.Policies() {
		for _, st := range states {
			t.Run(policy+"/"+st.name, func(t *testing.T) {
				c := newFakeClock()
				rs := make([]*balancer.Replica, 16)
				for i := range rs {
					rs[i] = newReplica(t, fmt.Sprintf("r%d", i), c, st.opts(i))
				}
				pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: policy}, rs)
				if err != nil {
					t.Fatal(err)
				}
				req := &balancer.Request{Now: t0, PrefixHash: 0x9e3779b97f4a7c15, AffinityKey: "session-42", ArmKey: "req-1"}
				if st.zeroNow {
					req.Now = time.Time{}
				}
				if n := testing.AllocsPerRun(200, func() { pool.Pick(req) }); n != 0 {
					t.Errorf("Pool.Pick allocates %v times per call, want 0", n)
				}
			})
		}
	}
}
