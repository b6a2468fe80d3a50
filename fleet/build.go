package fleet

import (
	"fmt"
	"maps"
	"reflect"
	"slices"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/proxy"
)

// state is one applied Spec and what serves it. Immutable once published.
type state struct {
	spec     Spec
	routes   []proxy.Route       // one per pool, in Spec order
	replicas []*balancer.Replica // every pool's, in Spec order
	poller   *gpu.Poller         // nil when telemetry is off
	prefix   []*poolPrefix       // per pool, in Spec order; nil where off
	models   *modelsWatch        // nil when no pool reads its replicas' adapters
}

// replicaKey is what identifies a live replica across states: a Spec that
// keeps all three keeps the replica (a changed GPU source does not matter:
// the poller is rebuilt anyway).
type replicaKey struct {
	name, url string
	weight    float64
}

// build makes the state serving spec (validated, defaults filled). With
// prev it carries over each replica whose key is unchanged within a pool
// serving the same routes (model, aliases, path prefix), that pool itself
// when the score is unchanged (its policy and replicas are then updated in
// place), and its admission controller when the admission config is too.
// Everything that can fail is built before any live pool is touched.
func (f *Fleet) build(spec Spec, prev *state) (*state, error) {
	type plan struct {
		old  proxy.Route // the previous route serving the same routes; zero if none
		reps []*balancer.Replica
		pool *balancer.Pool // set when a new pool is built
	}
	plans := make([]plan, len(spec.Pools))
	for i, pc := range spec.Pools {
		old, oldReps := prev.match(pc)
		pl := plan{old: old}
		for j, rc := range pc.Replicas {
			if rep := oldReps[replicaKey{rc.Name, rc.URL, rc.Weight}]; rep != nil {
				pl.reps = append(pl.reps, rep)
				continue
			}
			rep, err := balancer.NewReplica(balancer.ReplicaConfig{Name: rc.Name, URL: rc.URL, Weight: rc.Weight}, spec.Breaker, nil)
			if err != nil {
				return nil, fmt.Errorf("pools[%d].replicas[%d]: %w", i, j, err)
			}
			pl.reps = append(pl.reps, rep)
		}
		// A pool's pickers are built with the score, and its breakers
		// consult its ejection cap: reuse it only if both are unchanged.
		// Its adapters' config too (the adapters it learned are learned again).
		if old.Pool == nil || prev.spec.Score != spec.Score || prev.spec.MaxEjectionPercent != spec.MaxEjectionPercent ||
			!sameLoRA(old.Pool.LoRA(), pc.LoRA.LoRAConfig) {
			p, err := balancer.NewPool(balancer.PoolConfig{
				Model: pc.Model, Aliases: pc.Aliases, PathPrefix: pc.PathPrefix, Policy: pc.Policy,
				Arms: pc.Arms, Picker: balancer.PickerOptions{Score: spec.Score}, LoRA: pc.LoRA.LoRAConfig,
				MaxEjectionPercent: spec.MaxEjectionPercent,
			}, pl.reps)
			if err != nil {
				return nil, fmt.Errorf("pools[%d]: %w", i, err)
			}
			pl.pool = p
		}
		plans[i] = pl
	}

	st := &state{spec: spec}
	byPool := make([][]*balancer.Replica, len(plans))
	for i, pl := range plans {
		p := pl.pool
		if p == nil {
			p = pl.old.Pool
		}
		rt := proxy.Route{Pool: p, MaxTokens: spec.Pools[i].MaxTokens, Migration: spec.Pools[i].Migration}
		var err error
		if rt.Split, err = f.split(spec, spec.Pools[i], p, pl.reps); err != nil {
			return nil, fmt.Errorf("pools[%d].split: %w", i, err)
		}
		if spec.Admission != nil {
			if pl.pool == nil && pl.old.Admission != nil && reflect.DeepEqual(*prev.spec.Admission, *spec.Admission) {
				rt.Admission = pl.old.Admission // its queue stays
			} else {
				ctl, err := admission.New(p.Model(), *spec.Admission, admission.Deps{Pool: p, Metrics: f.opts.AdmissionMetrics})
				if err != nil {
					return nil, fmt.Errorf("pools[%d]: admission: %w", i, err)
				}
				rt.Admission = ctl
			}
		}
		st.routes = append(st.routes, rt)
		st.replicas = append(st.replicas, pl.reps...)
		byPool[i] = pl.reps
	}
	st.prefix = make([]*poolPrefix, len(plans))
	for i, pl := range plans {
		pp, err := f.buildPrefix(spec.Pools[i], pl.reps, prev.prefixOf(pl.old.Pool))
		if err != nil {
			for _, b := range st.prefix[:i] {
				if b != nil {
					b.undo()
				}
			}
			return nil, fmt.Errorf("pools[%d]: %w", i, err)
		}
		st.prefix[i] = pp
	}
	var err error
	if st.poller, err = f.newPoller(spec, st, byPool); err != nil {
		return nil, err
	}
	st.models = newModelsWatch(spec, st.routes, byPool, f.scrape, f.opts.Log)

	// Nothing can fail any more (the Spec is validated): update the live
	// pools carried over. Requests routed already keep what they picked.
	for i, pl := range plans {
		if pl.pool != nil {
			continue
		}
		pc := spec.Pools[i]
		var err error
		if len(pc.Arms) > 0 {
			err = pl.old.Pool.SetArms(pc.Arms)
		} else {
			err = pl.old.Pool.SetPolicy(pc.Policy)
		}
		if err != nil {
			return nil, fmt.Errorf("pools[%d]: %w", i, err)
		}
		pl.old.Pool.SetReplicas(pl.reps)
	}
	for i, pl := range plans {
		applyDraining(spec.Pools[i], pl.reps, prev.draining(spec.Pools[i]))
		f.applyPrefix(st.routes[i].Pool, pl.reps, st.prefix[i], prev.prefixOf(pl.old.Pool))
		if prev.prefixOf(pl.old.Pool) == nil {
			f.logPrefix(spec.Pools[i].Model, st.prefix[i])
		}
	}
	return st, nil
}

// prefixOf is the prefix index st built for pool; nil when none.
func (st *state) prefixOf(pool *balancer.Pool) *poolPrefix {
	if st == nil || pool == nil {
		return nil
	}
	for i, rt := range st.routes {
		if rt.Pool == pool {
			return st.prefix[i]
		}
	}
	return nil
}

// match finds the route of st serving the same routes as pc, and its
// replicas by key.
func (st *state) match(pc Pool) (proxy.Route, map[replicaKey]*balancer.Replica) {
	if st == nil {
		return proxy.Route{}, nil
	}
	for i, old := range st.spec.Pools {
		if old.Model != pc.Model || old.PathPrefix != pc.PathPrefix || !slices.Equal(old.Aliases, pc.Aliases) {
			continue
		}
		rt := st.routes[i]
		reps := make(map[replicaKey]*balancer.Replica, len(old.Replicas))
		for j, rc := range old.Replicas {
			reps[replicaKey{rc.Name, rc.URL, rc.Weight}] = rt.Pool.Replicas()[j]
		}
		return rt, reps
	}
	return proxy.Route{}, nil
}

// loops are the state's background loops besides health checking: each
// admission controller, the poller and each replica's KV-events
// subscriber.
func (st *state) loops() []runner {
	var out []runner
	for _, rt := range st.routes {
		if rt.Admission != nil {
			out = append(out, rt.Admission)
		}
		if rt.Split != nil && rt.Split.Admission != nil {
			out = append(out, rt.Split.Admission)
		}
	}
	if st.poller != nil {
		out = append(out, st.poller)
	}
	for _, pp := range st.prefix {
		if pp == nil {
			continue
		}
		for _, sub := range pp.subs {
			out = append(out, sub.Subscriber)
		}
	}
	if st.models != nil {
		out = append(out, st.models)
	}
	return out
}

// sameLoRA reports whether two pools' LoRA configs are the same.
func sameLoRA(a, b balancer.LoRAConfig) bool {
	return a.Blind == b.Blind && slices.Equal(a.Adapters, b.Adapters) && a.LoadOnDemand == b.LoadOnDemand &&
		maps.Equal(a.Paths, b.Paths) && a.LoadTimeout == b.LoadTimeout && a.LoadBackoff == b.LoadBackoff
}
