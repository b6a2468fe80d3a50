package balancer_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpurouter/gpurouter/balancer"
)

// TestAffinityAgreesAcrossRouters: router replicas share no state, yet
// prefix_affinity and session_affinity send a key to the same replica from
// every router, because each hashes the key over the replica set by the
// replicas' names. Four independent pools (four routers) hold the same
// five replicas, each its own objects in its own order (discovery may list
// them in any order); every key must get one answer from all four, idle
// and under the same load, and keys must spread over every replica.
func TestAffinityAgreesAcrossRouters(t *testing.T) {
	const routers, keys = 4, 2000
	names := []string{"vllm-0", "vllm-1", "vllm-2", "vllm-3", "vllm-4"}
	for _, policy := range []string{"prefix_affinity", "session_affinity"} {
		t.Run(policy, func(t *testing.T) {
			c := newFakeClock()
			rnd := rand.New(rand.NewPCG(1, 2))
			pools := make([]*balancer.Pool, routers)
			for i := range pools {
				order := rnd.Perm(len(names))
				rs := make([]*balancer.Replica, len(names))
				for j, k := range order {
					rs[j] = newReplica(t, names[k], c, replicaOpts{})
				}
				p, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: policy}, rs)
				if err != nil {
					t.Fatal(err)
				}
				pools[i] = p
			}
			for _, load := range []string{"idle", "equal load"} {
				if load == "equal load" {
					// Every router holds 2 requests on every replica.
					for _, p := range pools {
						for _, r := range p.Replicas() {
							for range 2 {
								if _, err := r.Acquire(); err != nil {
									t.Fatal(err)
								}
							}
						}
					}
				}
				spread := map[string]int{}
				for k := range keys {
					req := balancer.Request{Now: c.now()}
					if policy == "prefix_affinity" {
						req.PrefixHash = rnd.Uint64() | 1
					} else {
						req.AffinityKey = fmt.Sprintf("session-%d", k)
					}
					var first string
					for i, p := range pools {
						r := req
						got := p.Pick(&r)
						if got == nil {
							t.Fatalf("%s: router %d picked nothing", load, i)
						}
						if i == 0 {
							first = got.Name()
							spread[first]++
						} else if got.Name() != first {
							t.Fatalf("%s, key %d: router 0 picked %s, router %d %s", load, k, first, i, got.Name())
						}
					}
				}
				for _, n := range names {
					if spread[n] < keys/len(names)/3 {
						t.Errorf("%s: %s got %d of %d keys: %v", load, n, spread[n], keys, spread)
					}
				}
			}
		})
	}
}
