package fleet

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gpurouter/gpurouter/balancer"
)

// Errors of edits that name something the current state lacks.
var (
	ErrNoPool    = errors.New("fleet: no such pool")
	ErrNoReplica = errors.New("fleet: no such replica")
)

// Edits change one pool of the desired state, each applied to the state
// current when it takes effect (see Update), validated as a file would be.
// They live until the next reload replaces the whole state.

// AddReplica adds r to the pool serving model.
func (f *Fleet) AddReplica(model string, r Replica) error {
	return f.editPool(model, func(p *Pool) error {
		p.Replicas = append(p.Replicas, r)
		return nil
	})
}

// RemoveReplica removes the replica name from the pool serving model; its
// requests in flight finish.
func (f *Fleet) RemoveReplica(model, name string) error {
	return f.editPool(model, func(p *Pool) error {
		i := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.Name == name })
		if i < 0 {
			return fmt.Errorf("%w: %q", ErrNoReplica, name)
		}
		p.Replicas = slices.Delete(p.Replicas, i, i+1)
		return nil
	})
}

// SetReplicas replaces the replica set of the pool serving model: the
// path for discovery, which learns whole sets. Replicas whose name, URL
// and weight are unchanged stay as they are.
func (f *Fleet) SetReplicas(model string, rs []Replica) error {
	return f.editPool(model, func(p *Pool) error {
		p.Replicas = slices.Clone(rs)
		return nil
	})
}

// SetPolicy sets the pool's policy and experiment: with arms the pool
// runs them; without, the named policy ("" keeps the current one).
func (f *Fleet) SetPolicy(model, policy string, arms []balancer.Arm) error {
	return f.editPool(model, func(p *Pool) error {
		p.Arms = slices.Clone(arms)
		if policy != "" {
			p.Policy = policy
		}
		return nil
	})
}

// editPool applies change to the pool serving model in the current state.
func (f *Fleet) editPool(model string, change func(*Pool) error) error {
	return f.Update(Change{Next: func(cur Spec) (Spec, error) {
		i := cur.pool(model)
		if i < 0 {
			return Spec{}, fmt.Errorf("%w: %q", ErrNoPool, model)
		}
		if err := change(&cur.Pools[i]); err != nil {
			return Spec{}, err
		}
		return cur, nil
	}})
}
