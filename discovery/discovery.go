// Package discovery owns where a pool's replicas come from when they are
// not listed by hand: the addresses a DNS name resolves to, re-resolved
// every interval (DNS, here), or Kubernetes pods, a Service's
// EndpointSlices or an InferencePool, watched through client-go informers
// (discovery/kube).
//
// Each source learns whole replica sets and hands every set that differs
// from the last to a Sink (the command wires it to the fleet's one path
// for replica-set changes), logging one line and counting one
// gpurouter_discovery_changes_total per replica added, removed, drained
// or made ready again. Sources are background loops: constructors start
// nothing, Run(ctx) runs until ctx ends.
//
// This package knows nothing of the proxy or the fleet; it speaks in
// Endpoints.
package discovery

import (
	"cmp"
	"context"
	"slices"
)

// Endpoint is one replica a source found.
type Endpoint struct {
	// Name identifies the replica in metrics, logs and the admin API: a
	// pod's name (with ":port" where a pod serves several ports), else
	// host:port.
	Name string
	// URL is the engine's base URL, http://host:port.
	URL string
	// Draining means the endpoint is going away or not ready (a pod
	// terminating or failing its readiness probe): no new requests, while
	// those it serves finish. False means it takes requests.
	Draining bool
	// GPU is where the replica's GPU telemetry comes from, from its pod's
	// annotations; the zero value means none.
	GPU GPU
	// Role is the replica's role in prefill/decode disaggregation, from
	// its pod's labels: prefill, decode or both; "" (the zero value) means
	// colocated (fleet.Replica.Role).
	Role string
}

// GPU names a replica's GPU telemetry source outside the router's host,
// as a replica's gpu binding in the configuration file does: AgentURL with
// UUID, or DCGMURL with Label or UUID. The zero value means engine
// telemetry only.
type GPU struct {
	AgentURL string // a `gpurouter agent` beside the engine
	DCGMURL  string // a DCGM exporter's /metrics
	UUID     string // the replica's GPU
	Label    string // which of the exporter's GPUs: indexes or UUIDs, e.g. "0,1" (gpu.ParseSelector)
}

// Sink receives a pool's replica set each time it changes: every endpoint
// the source knows, sorted by name. An error leaves the sink as it was;
// the source offers the set again on its next change or resync.
type Sink interface {
	SetEndpoints(ctx context.Context, model string, eps []Endpoint) error
}

// Source is a discovery loop: *DNS, *kube.Source.
type Source interface {
	Run(ctx context.Context) error
}

// sortEndpoints orders eps by name, so that every router given the same
// set holds it in the same order.
func sortEndpoints(eps []Endpoint) {
	slices.SortFunc(eps, func(a, b Endpoint) int { return cmp.Compare(a.Name, b.Name) })
}
