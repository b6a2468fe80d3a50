package fleet

import (
	"context"
	"fmt"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/discovery"
	"github.com/gpurouter/gpurouter/gpu"
)

// SetEndpoints replaces the replica set of the pool serving model with the
// endpoints discovery found, as one change through Update (the path of
// reloads and admin edits): replicas whose name and URL stay keep their
// live state, new ones are added, missing ones are removed as
// RemoveReplica removes them (requests in flight finish), and each one's
// Draining follows its endpoint's. It is the discovery.Sink of every
// discovery source.
func (f *Fleet) SetEndpoints(_ context.Context, model string, eps []discovery.Endpoint) error {
	rs := make([]Replica, 0, len(eps))
	for _, e := range eps {
		r := Replica{Name: e.Name, URL: e.URL, Draining: e.Draining, Role: e.Role}
		if e.GPU != (discovery.GPU{}) && f.opts.DiscoveredGPU != nil {
			src, err := f.opts.DiscoveredGPU(e.GPU)
			if err != nil {
				return fmt.Errorf("replica %s: gpu: %w", e.Name, err)
			}
			r.GPU = src
		}
		rs = append(rs, r)
	}
	return f.editPool(model, func(p *Pool) error {
		if !p.Discovered {
			return fmt.Errorf("fleet: pool %q has no discovery", model)
		}
		p.Replicas = rs
		return nil
	})
}

// DiscoveredGPU builds the GPU telemetry source a discovered endpoint
// names (agent or DCGM exporter).
type DiscoveredGPU func(discovery.GPU) (gpu.Source, error)

// draining is the replicas of st's pool matching pc that discovery had
// draining, by key; nil when none or no st.
func (st *state) draining(pc Pool) map[replicaKey]bool {
	if st == nil {
		return nil
	}
	var out map[replicaKey]bool
	for _, old := range st.spec.Pools {
		if old.Model != pc.Model {
			continue
		}
		for _, rc := range old.Replicas {
			if rc.Draining {
				if out == nil {
					out = map[replicaKey]bool{}
				}
				out[replicaKey{rc.Name, rc.URL, rc.Weight}] = true
			}
		}
	}
	return out
}

// applyDraining sets the live replicas' drain flags where discovery's
// changed: on for every replica it has draining, off for one it had
// draining before and not now. Other replicas keep an operator's flag.
func applyDraining(pc Pool, reps []*balancer.Replica, was map[replicaKey]bool) {
	for j, rc := range pc.Replicas {
		switch {
		case rc.Draining:
			reps[j].SetDraining(true)
		case was[replicaKey{rc.Name, rc.URL, rc.Weight}]:
			reps[j].SetDraining(false)
		}
	}
}
