package proxy

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/proxy/observe"
)

// Route is one pool as the router serves it: the pool, the admission
// control in front of it and its output cap. The zero Admission and
// MaxTokens mean none.
type Route struct {
	Pool *balancer.Pool
	// Admission queues the pool's requests while it is saturated; nil
	// admits everything at once.
	Admission *admission.Controller
	// MaxTokens caps the output a request may ask for: max_tokens /
	// max_completion_tokens above it (or absent) are rewritten to it.
	// 0 means no cap.
	MaxTokens int
	// Migration continues the pool's streams on another replica when
	// theirs fails mid-stream (migrate.go); the zero value is off.
	Migration Migration
	// Split serves the pool's long prompts in two steps, prefill on one
	// replica and decode on another (disagg.go); nil serves every request
	// colocated.
	Split *Split
}

// poolRoute is a Route as the request path uses it, with the estimator
// that turns a request into its cost: the admission controller's (which
// learns from the engine's usage), else the server's plain one, which
// never learns and so keeps its defaults.
type poolRoute struct {
	Route
	est   *admission.Estimator
	queue prometheus.Observer // the pool's queue-time histogram child, resolved once
	tls   bool                // a replica of the pool is reached over TLS: the request loop leaves its requests to fasthttp
}

// goroutineOnly reports whether a request routed to pr, nil when its
// body's model routes it, is for fasthttp's goroutines: a request loop
// neither speaks TLS nor drives a split's prefill step (disagg.go), nor
// tokenizes a prompt for a prefix index keyed by the engines' tokens
// (prefix.go: tens of milliseconds for a long prompt, which would stall
// every other connection of the loop), nor waits for a LoRA adapter's
// load (lora_load.go).
func (rt *routeTable) goroutineOnly(pr *poolRoute) bool {
	if rt.tls && (pr == nil || pr.tls) || rt.split && (pr == nil || pr.Split != nil) ||
		rt.loads && (pr == nil || pr.Pool.LoRA().LoadOnDemand) {
		return true
	}
	if pr != nil {
		return tokenKeyed(pr.Pool)
	}
	for _, p := range rt.pools {
		if tokenKeyed(p) {
			return true
		}
	}
	return false
}

// tokenKeyed reports whether p's prefix index, which may change without
// the routes (fleet: applyPrefix), keys prompts by tokens: the router
// tokenizes each prompt routed to p.
func tokenKeyed(p *balancer.Pool) bool {
	pc := p.PrefixCache()
	return pc != nil && !pc.Approximate && pc.Tokenizer != nil
}

// SetRoutes replaces what the router serves, atomically and whole: pools,
// their admission and caps are one table, so a request sees one
// generation of all three. Requests already routed keep their replica and
// upstream connection until they end. Replicas carried over (the same
// *balancer.Replica) keep their upstream client and connections.
func (s *Server) SetRoutes(routes []Route) error {
	if len(routes) == 0 {
		return errors.New("proxy: no pools")
	}
	now := s.now()
	rt, err := buildRoutes(routes, s.plainEst, s.cfg, &s.to, s.m, s.lat, now, s.routes.Load())
	if err != nil {
		return err
	}
	s.routes.Store(rt)
	models := make([]string, 0, len(rt.pools))
	for _, p := range rt.pools {
		models = append(models, p.Model())
	}
	live := make(map[*observe.ReplicaLatency]bool, len(rt.upstreams))
	for _, u := range rt.upstreams {
		live[u.lat] = true
	}
	s.lat.Retain(models, live, now)
	return nil
}

// Pools returns the pools currently served.
func (s *Server) Pools() []*balancer.Pool { return s.routes.Load().pools }

// routeTable is the immutable map from requests to pools and replicas to
// upstream clients, swapped whole when the configuration changes.
type routeTable struct {
	pools     []*balancer.Pool
	routes    []*poolRoute
	byModel   map[string]*poolRoute // model names and aliases
	prefixes  []prefixRoute         // longest first
	upstreams map[*balancer.Replica]*upstream
	names     []string // the pools' models and aliases, in order
	models    []byte   // the /v1/models document when it was built
	tls       bool     // a pool has a replica reached over TLS (poolRoute.tls)
	split     bool     // a pool splits requests (Route.Split), which a request loop leaves to fasthttp
	loads     bool     // a pool loads LoRA adapters on demand, which a request loop leaves to fasthttp
}

// upstream looks up a replica's upstream; a nil table has none.
func (rt *routeTable) upstream(r *balancer.Replica) (*upstream, bool) {
	if rt == nil {
		return nil, false
	}
	u, ok := rt.upstreams[r]
	return u, ok
}

type prefixRoute struct {
	prefix string
	route  *poolRoute
}

func buildRoutes(routes []Route, plain *admission.Estimator, cfg Config, to *timeouts, m *metrics, lat *observe.Latency, now time.Time, prev *routeTable) (*routeTable, error) {
	rt := &routeTable{
		byModel:   make(map[string]*poolRoute),
		upstreams: make(map[*balancer.Replica]*upstream),
	}
	var names []string
	for _, r := range routes {
		p := r.Pool
		if p == nil {
			return nil, errors.New("proxy: a route without a pool")
		}
		pr := &poolRoute{Route: r, est: plain, queue: m.queue.WithLabelValues(p.Model())}
		if r.Admission != nil {
			pr.est = r.Admission.Estimator()
		}
		rt.pools = append(rt.pools, p)
		rt.routes = append(rt.routes, pr)
		rt.split = rt.split || r.Split != nil
		rt.loads = rt.loads || r.Pool.LoRA().LoadOnDemand
		for _, name := range append([]string{p.Model()}, p.Aliases()...) {
			if _, dup := rt.byModel[name]; dup {
				return nil, fmt.Errorf("proxy: model name %q used by two pools", name)
			}
			rt.byModel[name] = pr
			names = append(names, name)
		}
		if pp := strings.TrimRight(p.PathPrefix(), "/"); pp != "" {
			rt.prefixes = append(rt.prefixes, prefixRoute{prefix: pp, route: pr})
		}
		for _, rep := range p.Replicas() {
			pr.tls = pr.tls || rep.TLS()
			rt.tls = rt.tls || pr.tls
			if u, ok := prev.upstream(rep); ok && u.pool == p {
				rt.upstreams[rep] = u
				continue
			}
			rt.upstreams[rep] = newUpstream(p, rep, cfg, to, m, lat)
		}
	}
	sort.Slice(rt.prefixes, func(i, j int) bool { return len(rt.prefixes[i].prefix) > len(rt.prefixes[j].prefix) })
	rt.names = names
	rt.models = modelsJSON(names, rt.pools, now)
	return rt, nil
}
