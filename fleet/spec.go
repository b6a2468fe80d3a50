package fleet

import (
	"maps"
	"net/url"
	"slices"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/proxy"
)

// Spec is the fleet's desired state: the pools to serve and how. It is
// plain data (GPU sources aside), built by the command from its file, by
// an admin edit from the current Spec, or by discovery; a Fleet applies it
// whole. Zero fields mean what each says.
type Spec struct {
	Pools []Pool // at least one; model names and aliases unique across pools
	// Admission, per pool, queues requests while the pool is saturated;
	// nil means admission is off: every pool admits everything at once.
	Admission *admission.Config
	// Breaker is the circuit breaker of each replica this Spec creates;
	// replicas carried over keep theirs.
	Breaker balancer.BreakerConfig
	// Score is every pool's load scoring and telemetry staleness; a change
	// rebuilds the pools (their pickers are built with it).
	Score balancer.ScoreConfig
	// MaxEjectionPercent caps the share of each pool's replicas whose
	// breakers may be open at once (balancer.PoolConfig's; 0 means its
	// default); a change rebuilds the pools.
	MaxEjectionPercent float64
	// Telemetry scrapes each replica's engine /metrics and GPU source; nil
	// means no scraping (policies use router-side counts). Its Log is the
	// fleet's.
	Telemetry *gpu.PollerConfig
}

// Pool is the replicas serving one model and how they are picked.
type Pool struct {
	Model      string   // served model name, as clients send it; required
	Aliases    []string // other names routed here
	PathPrefix string   // optional route below /v1/ whose requests need no model field
	Policy     string   // a balancer policy; "" means balancer.DefaultPolicy
	// Arms, when set, make the pool an A/B experiment and replace Policy;
	// a zero Share means 1.
	Arms     []balancer.Arm
	Replicas []Replica // at least one
	// MaxTokens caps the output a request may ask for (larger or absent
	// max_tokens are rewritten to it); 0 means no cap.
	MaxTokens int
	// Engine is which engine's metrics the replicas expose (vLLM, SGLang,
	// llama.cpp, TGI, or none: not scraped); the zero value detects it
	// from each scrape.
	Engine gpu.Engine
	// Migration continues the pool's streams on another replica when
	// theirs fails mid-stream; the zero value is off.
	Migration proxy.Migration
	// LoRA is how the pool serves LoRA adapters of its model; the zero
	// value learns them from the replicas and places knowing them.
	LoRA LoRA
	// Split is how the pool splits long prompts between its prefill and
	// decode replicas (Replica.Role); used only when a replica prefills.
	Split Split
	// Discovered means discovery sets the replicas (SetEndpoints), so the
	// pool may have none (a Service scaled to zero, a name not yet
	// resolving): its requests then get 503 until some appear. False
	// means at least one replica is required.
	Discovered bool
	// Prefix is the pool's prefix-cache index: how the router learns
	// what each engine has cached, to route a prompt where its prefix is;
	// the zero value is off.
	Prefix PrefixCache
}

// Replica is one engine of a pool. Name, URL and Weight identify it: a
// Spec that keeps all three keeps the live replica (its counts, breaker,
// drain flag and telemetry).
type Replica struct {
	Name   string  // unique in the pool; "" means the URL's host:port
	URL    string  // http(s)://host:port of the engine; required
	Weight float64 // relative capacity; 0 means 1
	// GPU is where the replica's GPU telemetry comes from; nil means
	// engine telemetry only.
	GPU gpu.Source
	// Role is what the replica's KV connector lets the router ask of it
	// (RolePrefill, RoleDecode, RoleBoth); RoleColocated (""), the zero
	// value, serves whole requests only: it is never sent a prompt another
	// replica prefilled.
	Role string
	// Draining is discovery's word that the endpoint is going away or not
	// ready: no new requests, those in flight finish. It is applied when
	// it changes, so an operator's drain of a replica discovery keeps
	// ready stays; false means the replica takes requests unless an
	// operator drained it.
	Draining bool
}

// clone returns a copy of s that shares no slice with it, so a Change may
// edit what it is given.
func (s Spec) clone() Spec {
	out := s
	if s.Admission != nil {
		a := *s.Admission
		out.Admission = &a
	}
	if s.Telemetry != nil {
		t := *s.Telemetry
		out.Telemetry = &t
	}
	out.Pools = make([]Pool, len(s.Pools))
	for i, p := range s.Pools {
		p.Aliases = slices.Clone(p.Aliases)
		p.Arms = slices.Clone(p.Arms)
		p.Replicas = slices.Clone(p.Replicas)
		p.LoRA.Adapters = slices.Clone(p.LoRA.Adapters)
		p.LoRA.Paths = maps.Clone(p.LoRA.Paths)
		out.Pools[i] = p
	}
	return out
}

// withDefaults fills what the zero values mean where validation needs the
// value itself: replica names and weights, arm shares.
func (s Spec) withDefaults() Spec {
	for i := range s.Pools {
		p := &s.Pools[i]
		if p.Prefix.Mode == PrefixEvents {
			if p.Prefix.Tokenizer == "" {
				p.Prefix.Tokenizer = DefaultPrefixTokenizer
			}
		}
		for j := range p.Arms {
			if p.Arms[j].Share == 0 {
				p.Arms[j].Share = 1
			}
		}
		for j := range p.Replicas {
			r := &p.Replicas[j]
			if r.Weight == 0 {
				r.Weight = 1
			}
			if r.Name == "" {
				// An unparsable URL keeps the name empty; Validate
				// reports the URL itself.
				if u, err := url.Parse(r.URL); err == nil {
					r.Name = u.Host
				}
			}
		}
	}
	return s
}

// pool returns the index of the pool serving model, or -1.
func (s Spec) pool(model string) int {
	return slices.IndexFunc(s.Pools, func(p Pool) bool { return p.Model == model })
}
