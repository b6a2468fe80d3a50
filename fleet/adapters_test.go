package fleet

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
)

// vllmModels is vLLM's /v1/models with two LoRA adapters (serve
// --enable-lora --lora-modules sql-lora=... tweet-lora=...): the base
// model's parent is null, each adapter's the base model.
const vllmModels = `{"object":"list","data":[
{"id":"meta-llama/Llama-3.1-8B","object":"model","created":1733000000,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B","parent":null,"max_model_len":8192,"permission":[]},
{"id":"sql-lora","object":"model","created":1733000000,"owned_by":"vllm","root":"/adapters/sql","parent":"meta-llama/Llama-3.1-8B","max_model_len":null,"permission":[]},
{"id":"tweet-lora","object":"model","created":1733000000,"owned_by":"vllm","root":"/adapters/tweet","parent":"meta-llama/Llama-3.1-8B","max_model_len":null,"permission":[]}]}`

func TestAdaptersOf(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		want       []string
		err        error
	}{
		{"vLLM with adapters", vllmModels, []string{"sql-lora", "tweet-lora"}, nil},
		{"no adapters", `{"object":"list","data":[{"id":"m","parent":null}]}`, []string{}, nil},
		{"not JSON", `<html>`, nil, errModels},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := adaptersOf([]byte(tt.body))
			if !errors.Is(err, tt.err) || !slices.Equal(got, tt.want) {
				t.Fatalf("got %v %v, want %v %v", got, err, tt.want, tt.err)
			}
		})
	}
}

// Run reads each replica's /v1/models: its pool routes the adapters and
// the replica is known to serve them (and no others).
func TestModelsWatchLearnsAdapters(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			w.Write([]byte(vllmModels)) //nolint:errcheck
		}
	}))
	t.Cleanup(srv.Close)
	spec := onePool(Replica{Name: "a", URL: srv.URL})
	spec.Pools[0].Model = "meta-llama/Llama-3.1-8B"
	spec.Pools[0].LoRA = LoRA{LoRAConfig: balancer.LoRAConfig{Adapters: []string{"declared"}}, ModelsInterval: 20 * time.Millisecond}
	spec.Telemetry = &gpu.PollerConfig{Interval: time.Hour}
	f, tb := newFleet(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	p := tb.last()[0].Pool
	for !p.HasAdapter("tweet-lora") {
		select {
		case <-ctx.Done():
			t.Fatalf("no adapters learned in time: %v", p.Adapters())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if got := p.Adapters(); !slices.Equal(got, []string{"declared", "sql-lora", "tweet-lora"}) {
		t.Fatalf("adapters %v", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
