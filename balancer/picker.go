package balancer

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Request is what a Picker may look at about the request being routed. It is
// filled once by the proxy's parser; pickers must not retain it.
type Request struct {
	Model        string    // requested model name as sent by the client
	PromptTokens int       // estimated prompt size in tokens (0 if unknown)
	MaxTokens    int       // max_tokens / max_completion_tokens (0 if unset)
	AffinityKey  string    // session key: the `user` field or a header (may be empty)
	Now          time.Time // when the router received the request; the clock pickers use
}

// Picker chooses a replica for a request among candidates. It returns nil
// when none is available. Pick must not block and must not allocate.
type Picker interface {
	Pick(r *Request, candidates []*Replica) *Replica
}

// Policies lists the policy names NewPicker knows.
func Policies() []string { return []string{"least_request", "round_robin"} }

// NewPicker builds the named policy.
func NewPicker(name string) (Picker, error) {
	switch name {
	case "round_robin":
		return &RoundRobin{}, nil
	case "least_request", "":
		return &LeastRequest{}, nil
	}
	return nil, fmt.Errorf("balancer: unknown policy %q (known: %v)", name, Policies())
}

var (
	_ Picker = (*RoundRobin)(nil)
	_ Picker = (*LeastRequest)(nil)
)

// RoundRobin cycles through the available candidates. The zero value is
// ready to use.
type RoundRobin struct {
	next atomic.Uint64
}

// Pick returns the next available candidate after the previous pick.
func (p *RoundRobin) Pick(r *Request, candidates []*Replica) *Replica {
	n := uint64(len(candidates))
	if n == 0 {
		return nil
	}
	start := p.next.Add(1) - 1
	for i := uint64(0); i < n; i++ {
		c := candidates[(start+i)%n]
		if c.Available(r.Now) {
			return c
		}
	}
	return nil
}

// LeastRequest picks the available candidate with the fewest requests in
// flight from this router, relative to its weight. Ties rotate so equal
// replicas share traffic instead of the first one taking every tie. The zero
// value is ready to use.
type LeastRequest struct {
	next atomic.Uint64
}

// Pick returns the least-loaded available candidate.
func (p *LeastRequest) Pick(r *Request, candidates []*Replica) *Replica {
	n := len(candidates)
	if n == 0 {
		return nil
	}
	start := int(p.next.Add(1) % uint64(n))
	var best *Replica
	var bestLoad float64
	for i := 0; i < n; i++ {
		c := candidates[(start+i)%n]
		if !c.Available(r.Now) {
			continue
		}
		load := float64(c.InFlight()+1) / c.weight
		if best == nil || load < bestLoad {
			best, bestLoad = c, load
		}
	}
	return best
}
