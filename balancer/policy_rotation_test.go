package balancer_test

import (
	"testing"

	"github.com/gpurouter/gpurouter/balancer"
)

// Issue 14 ("and unbalances the others"): among replicas whose scores tie
// — which is where admission keeps them, each held just under the same
// saturation point — a scan policy must share picks evenly. The scan used
// to start at a rotating offset and take the first best, so the replica
// after one that is skipped (a long prefill under way, resting) inherited
// its turns: with [a, b skipped, c], c took 2 picks in 3. RoundRobin and
// least_request already moved the rotation past the replica chosen; the
// scored policies now do too. Before the fix: a 100, c 200.
func TestScanPoliciesShareTiesPastASkippedReplica(t *testing.T) {
	for _, policy := range []string{"least_loaded", "kv_aware", "least_tokens", "predictive"} {
		t.Run(policy, func(t *testing.T) {
			c := newFakeClock()
			a, b, cc := newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{}), newReplica(t, "c", c, replicaOpts{})
			// b runs a long prefill: a long request (LongPrefillCap 1) skips it.
			if _, err := b.AcquireCostKV(0, 0, true); err != nil {
				t.Fatal(err)
			}
			p, err := balancer.NewPicker(policy)
			if err != nil {
				t.Fatal(err)
			}
			got := map[*balancer.Replica]int{}
			cands := []*balancer.Replica{a, b, cc}
			for range 300 {
				got[p.Pick(&balancer.Request{Now: t0, LongPrefillCap: 1}, cands)]++
			}
			if got[a] != 150 || got[cc] != 150 || got[b] != 0 {
				t.Errorf("picks a %d, b %d, c %d; want 150, 0, 150", got[a], got[b], got[cc])
			}
		})
	}
}
