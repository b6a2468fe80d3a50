package balancer_test

import (
	"testing"

	"github.com/gpurouter/gpurouter/balancer"
)

// loadOnDemand is a pool config that loads adapter "ad" (with a path) on
// demand; "nopath" is declared without one.
func loadOnDemand() balancer.LoRAConfig {
	return balancer.LoRAConfig{Adapters: []string{"ad", "nopath"}, LoadOnDemand: true,
		Paths: map[string]string{"ad": "/adapters/ad"}}
}

// With load on demand, a replica that serves the adapter (its /v1/models
// lists it, or the router loaded it there) is preferred to one where it
// must be loaded, within the load bound; a replica listing it that is over
// the bound loses to a load elsewhere, so a hot adapter spreads.
func TestLoRALoadOnDemandPlacement(t *testing.T) {
	for _, policy := range scoringPolicies {
		t.Run(policy, func(t *testing.T) {
			c := newFakeClock()
			p, rs := loraPool(t, c, policy, 4, 4, loadOnDemand())
			for _, r := range rs {
				r.SetAdapters([]string{})
			}
			rs[2].SetAdapters([]string{"ad"})
			if r, _ := place(t, p, c, "ad"); r != rs[2] {
				t.Fatalf("the adapter's request went to %s, not the replica listing it", r.Name())
			}
			// The router's own load counts as serving it, until the next
			// /v1/models read says otherwise.
			rs[3].AdapterLoaded("ad")
			if !rs[3].HasAdapter("ad") || rs[1].HasAdapter("ad") {
				t.Fatal("HasAdapter does not follow AdapterLoaded")
			}
			if r, _ := place(t, p, c, "ad"); r != rs[3] && r != rs[2] {
				t.Fatalf("went to %s, which must load it", r.Name())
			}
			rs[3].SetAdapters([]string{})
			if rs[3].HasAdapter("ad") {
				t.Fatal("a /v1/models read without the adapter keeps the router's load")
			}
			// A hot adapter: the replicas that serve it fill to the bound,
			// then the others take requests (each a load first).
			got := map[*balancer.Replica]int{}
			for range 40 {
				r, _ := place(t, p, c, "ad")
				got[r]++
			}
			if len(got) < 3 {
				t.Fatalf("the hot adapter stayed on %d replicas: %v", len(got), got)
			}
		})
	}
}

// An adapter the pool cannot load (no path) keeps the tiers without load on
// demand: a replica whose /v1/models lacks it is the last resort.
func TestLoRALoadOnDemandNeedsPath(t *testing.T) {
	c := newFakeClock()
	p, rs := loraPool(t, c, "least_loaded", 2, 2, loadOnDemand())
	rs[0].SetAdapters([]string{})
	rs[1].SetAdapters([]string{"nopath"})
	for range 4 {
		if r, _ := place(t, p, c, "nopath"); r != rs[1] {
			t.Fatalf("went to %s, which lacks the adapter", r.Name())
		}
	}
	cfg := p.LoRA()
	if !cfg.Loadable("ad") || cfg.Loadable("nopath") || cfg.Loadable("other") {
		t.Fatal("Loadable")
	}
}

// Placing a loadable adapter's request allocates nothing either.
func TestLoRALoadOnDemandPickAllocs(t *testing.T) {
	c := newFakeClock()
	p, rs := loraPool(t, c, "predictive", 4, 4, loadOnDemand())
	rs[1].SetAdapters([]string{"ad"})
	rs[2].AdapterLoaded("ad")
	req := &balancer.Request{Model: "ad", Now: c.now(), PromptTokens: 500, OutputTokens: 50}
	if n := testing.AllocsPerRun(200, func() { p.Pick(req) }); n != 0 {
		t.Fatalf("%v allocs per Pick", n)
	}
}
