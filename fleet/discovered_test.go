package fleet

import (
	"context"
	"errors"
	"testing"

	"github.com/gpurouter/gpurouter/discovery"
	"github.com/gpurouter/gpurouter/gpu"
)

// Discovery's sets go through the one change path: a discovered pool may
// be empty, replicas that stay keep their live state, discovery's drain
// flag turns on and off as its endpoint does, an operator's drain of a
// replica discovery keeps ready stays, and a pool without discovery is
// refused.
func TestSetEndpoints(t *testing.T) {
	spec := Spec{Pools: []Pool{
		{Model: "d", Discovered: true},
		{Model: "s", Replicas: []Replica{{URL: "http://127.0.0.1:9"}}},
	}}
	var built []discovery.GPU
	f, err := New(spec, Options{DiscoveredGPU: func(g discovery.GPU) (gpu.Source, error) {
		built = append(built, g)
		if g.AgentURL == "bad" {
			return nil, errors.New("bad url")
		}
		return nil, nil
	}})
	if err != nil {
		t.Fatalf("a discovered pool starts empty: %v", err)
	}
	ctx := context.Background()
	a := discovery.Endpoint{Name: "a", URL: "http://127.0.0.2:8000"}
	b := discovery.Endpoint{Name: "b", URL: "http://127.0.0.3:8000"}
	if err := f.SetEndpoints(ctx, "d", []discovery.Endpoint{a, b}); err != nil {
		t.Fatal(err)
	}
	ra, rb := f.Replica("d", "a"), f.Replica("d", "b")
	if ra == nil || rb == nil || ra.Draining() || rb.Draining() {
		t.Fatalf("after add: a=%v b=%v", ra, rb)
	}
	rb.SetDraining(true) // an operator's

	a.Draining = true
	if err := f.SetEndpoints(ctx, "d", []discovery.Endpoint{a, b}); err != nil {
		t.Fatal(err)
	}
	if f.Replica("d", "a") != ra || !ra.Draining() {
		t.Fatalf("a: same live replica %v, draining %v; want the same one, draining", f.Replica("d", "a") == ra, ra.Draining())
	}
	if !rb.Draining() {
		t.Fatal("discovery undid an operator's drain of a replica it never drained")
	}
	a.Draining = false
	if err := f.SetEndpoints(ctx, "d", []discovery.Endpoint{a, b}); err != nil {
		t.Fatal(err)
	}
	if ra.Draining() {
		t.Fatal("a ready again, still draining")
	}
	if err := f.SetEndpoints(ctx, "d", []discovery.Endpoint{b}); err != nil {
		t.Fatal(err)
	}
	if f.Replica("d", "a") != nil || f.Replica("d", "b") != rb {
		t.Fatal("a should be removed, b kept")
	}
	if err := f.SetEndpoints(ctx, "d", nil); err != nil {
		t.Fatalf("empty set: %v", err)
	}
	if err := f.SetEndpoints(ctx, "s", []discovery.Endpoint{a}); err == nil {
		t.Fatal("a pool without discovery took a discovered set")
	}
	bad := discovery.Endpoint{Name: "g", URL: "http://127.0.0.4:8000", GPU: discovery.GPU{AgentURL: "bad"}}
	if err := f.SetEndpoints(ctx, "d", []discovery.Endpoint{bad}); err == nil {
		t.Fatal("an unusable GPU hint was accepted")
	}
	if len(built) != 1 {
		t.Fatalf("GPU sources built for %v; want only the endpoint that names one", built)
	}
	if _, err := New(Spec{Pools: []Pool{{Model: "x"}}}, Options{}); err == nil {
		t.Fatal("a pool without discovery and without replicas was accepted")
	}
}
