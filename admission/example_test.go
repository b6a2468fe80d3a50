package admission_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gpurouter/gpurouter/admission"
)

// replica stands in for the balancer's replica: its telemetry blended with
// the router's own counts, as a ReplicaLoad.
type replica struct {
	mu   sync.Mutex
	load admission.ReplicaLoad
}

// pool answers the controller's Capacity question with the saturation rule
// over its replicas, as balancer.Pool would.
type pool struct {
	sat      admission.SaturationConfig
	replicas []*replica
}

func (p *pool) Admissible(c admission.Cost) bool {
	for _, r := range p.replicas {
		r.mu.Lock()
		ok := p.sat.Fits(r.load, c)
		r.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// Example shows one request's way through admission, as the proxy does it.
func Example() {
	cfg := admission.Config{}
	p := &pool{sat: cfg.Saturation, replicas: []*replica{{load: admission.ReplicaLoad{KVCapacityTokens: 100_000}}}}
	metrics, _ := admission.NewMetrics(nil) // the router's prometheus.Registerer in real use
	ctrl, err := admission.New("llama", cfg, admission.Deps{Capacity: p, Metrics: metrics})
	if err != nil {
		panic(err)
	}
	// go ctrl.Run(ctx) beside the telemetry poller, which calls ctrl.Poke().

	// 1. Cost from the parsed request: raw prompt estimate, max_tokens,
	//    then the priority class, tenant and deadline from headers/API key.
	cost := ctrl.Estimate(1200, 0)
	cost.Class, cost.Tenant = 1, "team-a"

	// 2. Admit: may wait in the pool's queue.
	ticket, err := ctrl.Admit(context.Background(), cost)
	var shed *admission.ShedError
	switch {
	case errors.As(err, &shed):
		fmt.Println("429, Retry-After:", shed.RetryAfterSeconds())
		return
	case err != nil:
		fmt.Println("client gone:", err)
		return
	}

	// 3. The balancer picks and acquires a replica; then:
	ticket.Placed()

	// 4. When the response stream closes, with the engine's usage:
	ticket.ReleaseUsage(admission.Usage{PromptTokens: 1500, CompletionTokens: 180})

	fmt.Printf("admitted %d+%d tokens after %v; correction now %.2f\n",
		cost.PromptTokens, cost.OutputTokens, ticket.Waited(), ctrl.Estimator().Ratio())
	// Output: admitted 1200+256 tokens after 0s; correction now 1.25
}
