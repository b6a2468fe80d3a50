package balancer

import (
	"sync/atomic"
	"time"
)

// PoolConfig describes a set of replicas serving one model.
type PoolConfig struct {
	Model      string   // served model name, as clients send it
	Aliases    []string // other names that route here
	PathPrefix string   // optional route (e.g. /v1/chat/tinyllama) whose requests need no model field
	Policy     string   // picker name; empty means least_request
}

// Pool is the replicas behind one model and the policy that picks among
// them. The replica list is an immutable slice swapped atomically, so Pick
// never locks and a replica set change never disturbs requests in flight.
type Pool struct {
	cfg      PoolConfig
	picker   atomic.Pointer[pickerBox]
	replicas atomic.Pointer[[]*Replica]
}

// pickerBox lets an interface value live behind an atomic.Pointer.
type pickerBox struct {
	name string
	p    Picker
}

// NewPool builds a pool with its policy and replicas.
func NewPool(cfg PoolConfig, replicas []*Replica) (*Pool, error) {
	p := &Pool{cfg: cfg}
	if err := p.SetPolicy(cfg.Policy); err != nil {
		return nil, err
	}
	p.SetReplicas(replicas)
	return p, nil
}

// Model is the pool's served model name.
func (p *Pool) Model() string { return p.cfg.Model }

// Aliases are the other names routed to this pool.
func (p *Pool) Aliases() []string { return p.cfg.Aliases }

// PathPrefix is the pool's optional dedicated route ("" if none).
func (p *Pool) PathPrefix() string { return p.cfg.PathPrefix }

// Policy is the name of the current picker.
func (p *Pool) Policy() string { return p.picker.Load().name }

// SetPolicy replaces the picker; requests already routed are unaffected.
func (p *Pool) SetPolicy(name string) error {
	if name == "" {
		name = "least_request"
	}
	pk, err := NewPicker(name)
	if err != nil {
		return err
	}
	p.picker.Store(&pickerBox{name: name, p: pk})
	return nil
}

// Replicas is the current replica set. Callers must not modify it.
func (p *Pool) Replicas() []*Replica { return *p.replicas.Load() }

// SetReplicas replaces the replica set (copy-on-write).
func (p *Pool) SetReplicas(rs []*Replica) {
	cp := make([]*Replica, len(rs))
	copy(cp, rs)
	p.replicas.Store(&cp)
}

// Pick chooses a replica for r, or nil when none is available.
func (p *Pool) Pick(r *Request) *Replica {
	return p.picker.Load().p.Pick(r, *p.replicas.Load())
}

// PickExcept is Pick over the replicas other than skip (used for retries so
// a failed replica isn't chosen again for the same request). It allocates
// only on retries, never on a first attempt.
func (p *Pool) PickExcept(r *Request, skip []*Replica) *Replica {
	if len(skip) == 0 {
		return p.Pick(r)
	}
	all := *p.replicas.Load()
	rest := make([]*Replica, 0, len(all))
	for _, c := range all {
		if !contains(skip, c) {
			rest = append(rest, c)
		}
	}
	return p.picker.Load().p.Pick(r, rest)
}

func contains(rs []*Replica, r *Replica) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// Available counts the replicas a picker could choose at now.
func (p *Pool) Available(now time.Time) int {
	n := 0
	for _, r := range *p.replicas.Load() {
		if r.Available(now) {
			n++
		}
	}
	return n
}
