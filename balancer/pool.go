package balancer

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"
)

// PoolConfig describes a set of replicas serving one model.
type PoolConfig struct {
	Model      string   // served model name, as clients send it
	Aliases    []string // other names that route here
	PathPrefix string   // optional route (e.g. /v1/chat/tinyllama) whose requests need no model field
	Policy     string   // picker name; empty means DefaultPolicy
	// Arms, when set, make the pool an A/B experiment: each request is
	// assigned an arm (by a stable hash of Request.ArmKey, or forced by
	// Request.Arm) and routed by that arm's policy. Policy is then unused.
	Arms []Arm
	// Picker tunes the load-based policies and injects their randomness.
	Picker PickerOptions
	// LoRA is how the pool serves LoRA adapters of its model (lora.go);
	// the zero value learns them from the replicas and places knowing them.
	LoRA LoRAConfig
	// MaxEjectionPercent caps the share of the pool's replicas whose
	// circuit breakers may be open at once (Envoy's max_ejection_percent);
	// one replica may always be ejected. 0 means DefaultMaxEjectionPercent
	// (50); 100 or more, or negative, means no cap.
	MaxEjectionPercent float64
}

// Arm is one side of an A/B experiment.
type Arm struct {
	Name   string  // label in metrics and the X-Gpurouter-Policy header
	Policy string  // picker name
	Share  float64 // share of traffic; shares are normalised to sum to 1
}

// Pool is the replicas behind one model and the policy (or A/B arms) that
// picks among them. The replica list and the arms are immutable values
// swapped atomically, so Pick never locks and a change never disturbs
// requests in flight.
type Pool struct {
	cfg      PoolConfig
	score    ScoreConfig // cfg.Picker.Score with defaults: the staleness bound Loads applies
	arms     atomic.Pointer[armSet]
	replicas atomic.Pointer[[]*Replica]
	group    atomic.Int64 // requests in flight on the pool's replicas
	prefix   atomic.Pointer[PrefixCache]
	lora     loraCatalog
}

// armSet is the pool's current policy: one arm, or an experiment.
type armSet struct {
	arms []armPicker
}

type armPicker struct {
	name, policy string
	share        float64 // normalised
	end          float64 // cumulative share: the arm owns [end-share, end)
	p            Picker
}

// NewPool builds a pool with its policy (or arms) and replicas.
func NewPool(cfg PoolConfig, replicas []*Replica) (*Pool, error) {
	p := &Pool{cfg: cfg, score: cfg.Picker.Score.withDefaults()}
	p.replicas.Store(&[]*Replica{})
	var err error
	if len(cfg.Arms) > 0 {
		err = p.SetArms(cfg.Arms)
	} else {
		err = p.SetPolicy(cfg.Policy)
	}
	if err != nil {
		return nil, err
	}
	p.SetReplicas(replicas)
	p.LearnAdapters(cfg.LoRA.Adapters)
	return p, nil
}

// Model is the pool's served model name.
func (p *Pool) Model() string { return p.cfg.Model }

// Aliases are the other names routed to this pool.
func (p *Pool) Aliases() []string { return p.cfg.Aliases }

// PathPrefix is the pool's optional dedicated route ("" if none).
func (p *Pool) PathPrefix() string { return p.cfg.PathPrefix }

// Policy describes the current policy: its name, or the experiment's arms.
func (p *Pool) Policy() string {
	set := p.arms.Load()
	if len(set.arms) == 1 {
		return set.arms[0].policy
	}
	parts := make([]string, len(set.arms))
	for i, a := range set.arms {
		parts[i] = fmt.Sprintf("%s=%s:%.2f", a.name, a.policy, a.share)
	}
	return "experiment(" + strings.Join(parts, ",") + ")"
}

// Arms lists the current arms (one, named after the policy, when the pool
// runs no experiment).
func (p *Pool) Arms() []Arm {
	set := p.arms.Load()
	out := make([]Arm, len(set.arms))
	for i, a := range set.arms {
		out[i] = Arm{Name: a.name, Policy: a.policy, Share: a.share}
	}
	return out
}

// SetPolicy replaces the picker with one policy; requests already routed
// are unaffected.
func (p *Pool) SetPolicy(name string) error {
	if name == "" {
		name = DefaultPolicy
	}
	return p.SetArms([]Arm{{Name: name, Policy: name, Share: 1}})
}

// SetArms replaces the policy with an A/B experiment.
func (p *Pool) SetArms(arms []Arm) error {
	if len(arms) == 0 {
		return errors.New("balancer: no arms")
	}
	var total float64
	seen := map[string]bool{}
	for _, a := range arms {
		if a.Name == "" || seen[a.Name] {
			return fmt.Errorf("balancer: arm names must be unique and non-empty (%q)", a.Name)
		}
		if !(a.Share > 0) || math.IsInf(a.Share, 0) {
			return fmt.Errorf("balancer: arm %q: share must be > 0", a.Name)
		}
		seen[a.Name] = true
		total += a.Share
	}
	set := &armSet{}
	var end float64
	for _, a := range arms {
		pk, err := NewPickerWith(a.Policy, p.cfg.Picker)
		if err != nil {
			return fmt.Errorf("arm %q: %w", a.Name, err)
		}
		share := a.Share / total
		end += share
		set.arms = append(set.arms, armPicker{name: a.Name, policy: a.Policy, share: share, end: end, p: pk})
	}
	set.arms[len(set.arms)-1].end = 1
	prepare(set, *p.replicas.Load())
	p.arms.Store(set)
	return nil
}

func prepare(set *armSet, rs []*Replica) {
	for _, a := range set.arms {
		if pr, ok := a.p.(preparer); ok {
			pr.Prepare(rs)
		}
	}
}

// Replicas is the current replica set. Callers must not modify it.
func (p *Pool) Replicas() []*Replica { return *p.replicas.Load() }

// SetReplicas replaces the replica set (copy-on-write).
func (p *Pool) SetReplicas(rs []*Replica) {
	cp := make([]*Replica, len(rs))
	copy(cp, rs)
	var inFlight int64
	for _, r := range cp {
		r.group.Store(&p.group)
		r.pool.Store(p)
		inFlight += r.inFlight.Load()
	}
	p.group.Store(inFlight)
	if set := p.arms.Load(); set != nil {
		prepare(set, cp)
	}
	p.replicas.Store(&cp)
}

// arm returns the arm for r, resolving r.Arm on first use so a retry of
// the same request stays in its arm. A forced arm that doesn't exist is
// ignored.
func (set *armSet) arm(r *Request) *armPicker {
	if len(set.arms) == 1 {
		r.Arm = set.arms[0].name
		return &set.arms[0]
	}
	if r.Arm != "" {
		for i := range set.arms {
			if set.arms[i].name == r.Arm {
				return &set.arms[i]
			}
		}
	}
	u := float64(hashString(r.ArmKey)>>11) / (1 << 53) // uniform in [0,1)
	for i := range set.arms {
		if u < set.arms[i].end {
			r.Arm = set.arms[i].name
			return &set.arms[i]
		}
	}
	a := &set.arms[len(set.arms)-1]
	r.Arm = a.name
	return a
}

// Pick chooses a replica for r, or nil when none is available. It sets
// r.Arm to the arm that decided.
func (p *Pool) Pick(r *Request) *Replica {
	return p.pick(p.arms.Load().arm(r).p, r, *p.replicas.Load())
}

// pick runs the policy over candidates: first among those where the
// request's Room says it fits, then, if none does, among all of them.
func (p *Pool) pick(pk Picker, r *Request, candidates []*Replica) *Replica {
	p.lookupPrefix(r)
	p.lookupAdapter(r)
	if r.Room != nil {
		r.roomOn, r.poolScore = true, &p.score
		c := pk.Pick(r, candidates)
		r.roomOn = false
		if c != nil {
			return c
		}
	}
	return pk.Pick(r, candidates)
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
	return p.pick(p.arms.Load().arm(r).p, r, rest)
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

// InFlight is the number of requests in flight on the pool's replicas.
func (p *Pool) InFlight() int64 { return p.group.Load() }
