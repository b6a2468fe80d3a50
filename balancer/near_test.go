package balancer_test

import (
	"math/rand/v2"
	"testing"

	"github.com/gpurouter/gpurouter/balancer"
)

// TestLeastLoadedNearEqual: with NearEqual set, least_loaded picks at
// random among the replicas within that many requests of the lowest, and
// never one further; off, it always takes the lowest. Neither allocates.
func TestLeastLoadedNearEqual(t *testing.T) {
	c := newFakeClock()
	// No telemetry: the score is the router's in-flight count.
	cands := []*balancer.Replica{
		newReplica(t, "a", c, replicaOpts{inFlight: 10}),
		newReplica(t, "b", c, replicaOpts{inFlight: 11}),
		newReplica(t, "c", c, replicaOpts{inFlight: 12}),
		newReplica(t, "d", c, replicaOpts{inFlight: 15}),
	}
	req := &balancer.Request{Now: c.now()}
	tests := []struct {
		name string
		near float64
		want map[string]bool // replicas that may be picked
	}{
		{"off", 0, map[string]bool{"a": true}},
		{"within one", 1, map[string]bool{"a": true, "b": true}},
		{"within two", 2, map[string]bool{"a": true, "b": true, "c": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(7, 7))
			p, err := balancer.NewPickerWith("least_loaded", balancer.PickerOptions{
				Score: balancer.ScoreConfig{NearEqual: tt.near}, Rand: rnd.IntN})
			if err != nil {
				t.Fatal(err)
			}
			got := countPicks(t, p, req, cands, 3000, false)
			for name, n := range got {
				if !tt.want[name] {
					t.Fatalf("picked %s %d times: %v", name, n, got)
				}
			}
			for name := range tt.want {
				// Uniform among the near-equals: each near 3000/len.
				if share := float64(got[name]) / 3000; share < 0.8/float64(len(tt.want)) {
					t.Fatalf("%s got %.0f%% of the picks, want about %.0f%%: %v", name, 100*share, 100/float64(len(tt.want)), got)
				}
			}
			if a := testing.AllocsPerRun(100, func() { p.Pick(req, cands) }); a != 0 {
				t.Fatalf("%v allocs per Pick", a)
			}
		})
	}
}
