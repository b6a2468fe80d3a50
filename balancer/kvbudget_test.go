package balancer_test

import (
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
)

// TestTokenBudgetCountsTheFullestMoment: a replica with 30,000 tokens of
// KV cache runs twenty 1,100-token prompts asking for 400 tokens, spread
// over their decode. Their footprints sum to the whole cache (the old
// measure: no room), but they will never hold more than 26,180 tokens at
// once, so a twenty-first fits; a request before its first token counts
// whole, and the requests' progress is what the measure follows.
func TestTokenBudgetCountsTheFullestMoment(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "r", c, replicaOpts{})
	pool := newPool(t, "m", r)
	r.SetEngineLoad(balancer.EngineLoad{KVCapacityTokens: 30000, At: c.now()})
	var leases []balancer.Lease
	for i := range 20 {
		l, err := r.AcquireRequest(balancer.LeaseCost{KV: 1500, PromptTokens: 1100, OutputTokens: 400})
		if err != nil {
			t.Fatal(err)
		}
		l.PrefillDone()
		for range i * 20 { // request i has made 1 + 20·i tokens
			l.ObserveGap(50*time.Millisecond, c.now())
		}
		leases = append(leases, l)
	}
	sat := admission.SaturationConfig{}
	req := admission.Cost{PromptTokens: 1100, OutputTokens: 400}
	load := pool.Loads(c.now(), nil)[0]
	if r.KVReserved() != 30000 {
		t.Fatalf("reserved %d, want 30,000", r.KVReserved())
	}
	// Request i holds 1,101+20i (25,820 in all) and grows until 399-20i
	// steps from now: the fullest, 26,180, is at the step before the
	// furthest along ends.
	if load.OutstandingTokens != 26180 {
		t.Fatalf("fullest KV %d, want 26,180", load.OutstandingTokens)
	}
	if !sat.Fits(load, req) {
		t.Fatalf("fullest KV %d of 30,000: a 1,500-token request must fit", load.OutstandingTokens)
	}
	fresh, err := r.AcquireRequest(balancer.LeaseCost{KV: 1500, PromptTokens: 1100, OutputTokens: 400})
	if err != nil {
		t.Fatal(err)
	}
	prev := load.OutstandingTokens
	load = pool.Loads(c.now(), nil)[0]
	if load.OutstandingTokens != prev+1500 {
		t.Errorf("a request placed, before its first token: %d, want %d + its whole 1,500", load.OutstandingTokens, prev)
	}
	for _, l := range leases[:10] {
		l.Done(nil)
	}
	fresh.Done(nil)
	load = pool.Loads(c.now(), nil)[0]
	if load.OutstandingTokens >= prev/2+1500 {
		t.Errorf("half the requests ended: fullest KV %d, want it to fall with them (was %d)", load.OutstandingTokens, prev)
	}
	for _, l := range leases[10:] {
		l.Done(nil)
	}
	if load = pool.Loads(c.now(), nil)[0]; load.OutstandingTokens != 0 || r.KVReserved() != 0 {
		t.Errorf("all ended: fullest KV %d, reserved %d", load.OutstandingTokens, r.KVReserved())
	}
}
