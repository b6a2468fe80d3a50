package gpu_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
	"github.com/gpurouter/gpurouter/gpu"
)

// startSim runs one simulated vLLM replica on a loopback port for the test.
func startSim(t *testing.T, legacy bool) (string, *sim.Replica) {
	t.Helper()
	p, err := sim.ResolveProfile("qwen2.5-7b")
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.NewFleet(sim.FleetConfig{Replicas: 1, Profiles: []sim.Profile{p}, LegacyMetrics: legacy})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return f.URLs()[0], f.Replicas()[0]
}

func fetchCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The simulator's /metrics is what a vLLM replica serves; the scraper reads
// it whole, in both the current and the pre-0.10 naming.
func TestEngineScraperAgainstSimulator(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(map[bool]string{false: "v1", true: "legacy"}[legacy], func(t *testing.T) {
			t.Parallel()
			url, _ := startSim(t, legacy)
			sc, err := gpu.NewEngineScraper(url, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(sc.URL(), "/metrics") {
				t.Errorf("URL %q", sc.URL())
			}
			s, err := sc.Fetch(fetchCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			need := gpu.FieldRunning | gpu.FieldWaiting | gpu.FieldKVUsage | gpu.FieldKVCapacity |
				gpu.FieldPrefixCache | gpu.FieldPreemptions | gpu.FieldFinished
			if !s.Reported.Has(need) || s.Engines != 1 || s.KVCapacityTokens <= 0 || s.Running != 0 || s.KVUsage != 0 {
				t.Errorf("idle replica: %+v", *s)
			}
		})
	}
}

// A simulated replica serving LoRA adapters: the parser reads its
// vllm:lora_requests_info as a vLLM one, the newest series among the
// history a run leaves.
func TestEngineScraperLoRAAgainstSimulator(t *testing.T) {
	t.Parallel()
	p, err := sim.ResolveProfile("qwen2.5-7b")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"enable-lora", "true"}, {"max-loras", "2"}, {"max-cpu-loras", "4"}} {
		if err := p.Set(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	f, err := sim.NewFleet(sim.FleetConfig{Replicas: 1, Profiles: []sim.Profile{p},
		LoRAModules: []sim.LoRAModule{{Name: "sql", Path: "/a/sql"}, {Name: "chat", Path: "/a/chat"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	url, r := f.URLs()[0], f.Replicas()[0]
	sc, err := gpu.NewEngineScraper(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sc.Fetch(fetchCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Reported.Has(gpu.FieldLoRA) || s.LoRA.MaxLoRAs != 2 || s.LoRA.Running != nil || s.LoRA.Waiting != nil {
		t.Errorf("idle LoRA replica: %+v", s.LoRA)
	}

	// One long request for sql in flight: running_lora_adapters says so.
	reqCtx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		req, _ := http.NewRequestWithContext(reqCtx, "POST", url+"/v1/completions",
			strings.NewReader(`{"model":"sql","prompt":"x","max_tokens":5000,"ignore_eos":true,"stream":true}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for r.State().Running == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request never ran")
		}
		time.Sleep(5 * time.Millisecond) // polling the engine's state, bounded
	}
	if s, err = sc.Fetch(fetchCtx(t)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.LoRA.Running, []string{"sql"}) || s.LoRA.Waiting != nil || s.LoRA.Updated.IsZero() {
		t.Errorf("sql running: %+v", s.LoRA)
	}
}

// The simulator's GET /v1/gpus is the agent's document: an AgentSource
// pointed at it reads the replica's simulated GPUs, faults included.
func TestAgentSourceAgainstSimulator(t *testing.T) {
	t.Parallel()
	url, r := startSim(t, false)
	if err := r.SetFaults(sim.Faults{ThrottleReasons: []string{"hw_thermal_slowdown"}, XidErrors: 2}); err != nil {
		t.Fatal(err)
	}
	all, err := gpu.NewAgentSource(url, gpu.Selector{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := all.Fetch(fetchCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) == 0 {
		t.Fatal("no GPUs")
	}
	g := gpus[0]
	if !strings.HasPrefix(g.UUID, "GPU-") || g.MemoryTotalBytes == 0 || g.MemoryUsedBytes == 0 || g.PowerWatts <= 0 ||
		g.XidErrors != 2 || !slices.Equal(g.ThrottleReasons, []string{"hw_thermal_slowdown"}) || g.SMClockMHz >= g.SMClockMaxMHz {
		t.Errorf("simulated GPU: %+v", g)
	}
	byUUID, _ := gpu.NewAgentSource(url, gpu.Selector{UUIDs: []string{g.UUID}}, nil)
	if one, err := byUUID.Fetch(fetchCtx(t)); err != nil || len(one) != 1 || one[0].UUID != g.UUID {
		t.Errorf("by UUID: %v %v", one, err)
	}
	other, _ := gpu.NewAgentSource(url, gpu.Selector{Indexes: []int{len(gpus)}}, nil)
	if _, err := other.Fetch(fetchCtx(t)); !errors.Is(err, gpu.ErrGPUNotFound) {
		t.Errorf("index past the replica's GPUs: %v", err)
	}
}
