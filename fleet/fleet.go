// Package fleet owns the router's live configuration: the desired state
// (a Spec), every change to it — a reload from the file, an admin edit, a
// replica-set change — applied one at a time under one lock, each to the
// state current at that moment, and what serves it: pools, replicas,
// admission controllers and the telemetry poller, carried over where
// unchanged so that requests in flight keep what they hold. Each applied
// state is published to the proxy as one immutable route table.
//
// Fleet.Run runs every background loop the fleet owns (health checks,
// admission controllers, the poller) and starts and stops them as the
// state changes; Admin is the operators' HTTP API over a Fleet.
package fleet

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/kvevents"
	"github.com/gpurouter/gpurouter/proxy"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Router serves route tables: *proxy.Server.
type Router interface {
	SetRoutes(routes []proxy.Route) error
}

// Options are a Fleet's fixed dependencies: what no Spec changes. Zero
// fields take the defaults noted.
type Options struct {
	Health balancer.HealthConfig // active health checks of every replica
	Prober balancer.Prober       // nil means balancer.HTTPProber on the default path
	// AdmissionMetrics receives the admission controllers' series; nil
	// means none are exported.
	AdmissionMetrics *admission.Metrics
	// DiscoveredGPU builds the GPU sources discovered endpoints name; nil
	// means their GPU hints are ignored.
	DiscoveredGPU DiscoveredGPU
	// KVEventsMetrics receives the KV-event subscribers' series (pools
	// with a prefix index fed by events); nil means none are exported.
	KVEventsMetrics *kvevents.Metrics
	Log             *zap.Logger // nil means no logging
}

// Fleet is the live configuration and what serves it. Build with New; the
// zero value is unusable. Safe for concurrent use.
type Fleet struct {
	opts   Options
	health *balancer.HealthChecker
	scrape *fasthttp.Client // engine /metrics scrapes, shared by every poller

	// mu serialises changes: each Change reads the state current under
	// it and publishes its result before the next one starts.
	mu     sync.Mutex
	router Router // set by Attach; guarded by mu
	state  atomic.Pointer[state]

	changed chan struct{} // wakes Run to reconcile its loops; buffered 1
	running atomic.Bool   // Run is running
}

// New builds the fleet for spec, with nothing started and nothing
// published: pass Routes to the proxy, then Attach it.
func New(spec Spec, o Options) (*Fleet, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.Prober == nil {
		o.Prober = balancer.HTTPProber{}
	}
	f := &Fleet{
		opts:    o,
		changed: make(chan struct{}, 1),
		scrape: &fasthttp.Client{
			Name:                          "gpurouter-telemetry",
			MaxIdleConnDuration:           4 * time.Second, // below uvicorn's 5 s keep-alive
			NoDefaultUserAgentHeader:      true,
			DisableHeaderNamesNormalizing: true,
			MaxConnsPerHost:               4,
		},
	}
	spec = spec.clone().withDefaults()
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	st, err := f.build(spec, nil)
	if err != nil {
		return nil, err
	}
	f.state.Store(st)
	f.health = balancer.NewHealthChecker(o.Health, o.Prober, f.Replicas, o.Log)
	return f, nil
}

// Attach makes r serve the fleet: the current table is published to it at
// once, and every later change too. Call it once, with the proxy built
// from Routes.
func (f *Fleet) Attach(r Router) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := r.SetRoutes(f.state.Load().routes); err != nil {
		return err
	}
	f.router = r
	return nil
}

// Change is one change of the desired state.
type Change struct {
	// Next computes the state to apply from the current one (a copy it
	// may edit). It runs under the fleet's lock, so a reload that reads
	// its file here applies the file as it is when the reload takes
	// effect, and an edit never works on a stale state.
	Next func(current Spec) (Spec, error)
	// Applied, if not nil, runs once the new state is published, still
	// under the lock, so that what the caller keeps beside the Spec (the
	// command's client keys and file configuration) changes in the same
	// order.
	Applied func()
}

// Update applies c: the next state is validated, built (carrying over
// what is unchanged) and published as one route table. On any error the
// fleet keeps its current state and the error says why.
func (f *Fleet) Update(c Change) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.state.Load()
	next, err := c.Next(cur.spec.clone())
	if err != nil {
		return err
	}
	next = next.clone().withDefaults()
	if err := next.Validate(); err != nil {
		return err
	}
	st, err := f.build(next, cur)
	if err != nil {
		return err
	}
	if f.router != nil {
		if err := f.router.SetRoutes(st.routes); err != nil {
			return err
		}
	}
	f.state.Store(st)
	select {
	case f.changed <- struct{}{}:
	default: // Run has a wake-up pending already
	}
	if c.Applied != nil {
		c.Applied()
	}
	return nil
}

// Reload replaces the desired state with spec.
func (f *Fleet) Reload(spec Spec) error {
	return f.Update(Change{Next: func(Spec) (Spec, error) { return spec, nil }})
}

// Spec is the desired state currently applied (a copy).
func (f *Fleet) Spec() Spec { return f.state.Load().spec.clone() }

// Routes is the route table currently published. Callers must not modify
// it.
func (f *Fleet) Routes() []proxy.Route { return f.state.Load().routes }

// Replicas is every replica currently served. Callers must not modify it.
func (f *Fleet) Replicas() []*balancer.Replica { return f.state.Load().replicas }

// Replica is the live replica name of the pool serving model, or nil.
func (f *Fleet) Replica(model, name string) *balancer.Replica {
	for _, rt := range f.state.Load().routes {
		if rt.Pool.Model() != model {
			continue
		}
		for _, r := range rt.Pool.Replicas() {
			if r.Name() == name {
				return r
			}
		}
	}
	return nil
}

// errRunning is Run's answer when it is already running.
var errRunning = errors.New("fleet: Run is already running")
