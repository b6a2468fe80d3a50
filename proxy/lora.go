package proxy

import (
	"encoding/json"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// LoRA adapters at the router's edge: a request whose model is one of a
// pool's adapters (balancer.Pool.HasAdapter: declared, listed by a
// replica's /v1/models, or named in its metrics) goes to that pool, with
// its model unchanged — the engine runs the adapter by that name — and
// /v1/models lists each adapter with its base model as parent, as vLLM
// does. Which replica holds which adapter is the balancer's business.

// adapterRoute is the route of the pool serving adapter model, nil when
// no pool has it.
func (rt *routeTable) adapterRoute(model string) *poolRoute {
	for _, r := range rt.routes {
		if r.Pool.HasAdapter(model) {
			return r
		}
	}
	return nil
}

// modelCard is one entry of /v1/models. Parent is set for a LoRA adapter
// (its base model), as in vLLM's answer; omitted for a served model.
type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Root    string `json:"root,omitempty"`
	Parent  string `json:"parent,omitempty"`
}

// modelsJSON renders /v1/models: names, each a served model, then the
// adapters of pools (each with its pool's model as parent).
func modelsJSON(names []string, pools []*balancer.Pool, now time.Time) []byte {
	doc := struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{Object: "list", Data: []modelCard{}}
	for _, n := range names {
		doc.Data = append(doc.Data, modelCard{ID: n, Object: "model", Created: now.Unix(), OwnedBy: "gpurouter"})
	}
	for _, p := range pools {
		for _, a := range p.Adapters() {
			doc.Data = append(doc.Data, modelCard{ID: a, Object: "model", Created: now.Unix(), OwnedBy: "gpurouter", Root: a, Parent: p.Model()})
		}
	}
	b, _ := json.Marshal(doc)
	return b
}

// modelsNow is the table's /v1/models document: the one built with the
// table, unless a pool has adapters, which may have been learned since.
func (rt *routeTable) modelsNow(now time.Time) []byte {
	for _, p := range rt.pools {
		if len(p.Adapters()) > 0 {
			return modelsJSON(rt.names, rt.pools, now)
		}
	}
	return rt.models
}
