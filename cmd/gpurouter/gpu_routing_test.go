package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
	"github.com/gpurouter/gpurouter/gpu"
	"go.uber.org/zap"
)

// startSimFleet runs n simulated replicas on ephemeral loopback ports.
func startSimFleet(t *testing.T, n int, faults []sim.Faults) *sim.Fleet {
	t.Helper()
	prof, err := sim.Builtin("tinyllama-1.1b-a10")
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := sim.NewFleet(sim.FleetConfig{Replicas: n, Profiles: []sim.Profile{prof}, ServedModelNames: []string{"m"}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.Listen(); err != nil {
		t.Fatal(err)
	}
	for i, f := range faults {
		if err := fleet.Replicas()[i].SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fleet.Run(ctx); close(done) }() //nolint:errcheck
	t.Cleanup(func() { cancel(); <-done })
	return fleet
}

// startConfiguredRouter runs the router exactly as `serve` builds it.
func startConfiguredRouter(t *testing.T, cfg fileConfig) string {
	t.Helper()
	url, _ := runConfiguredRouter(t, cfg)
	return url
}

// runConfiguredRouter is startConfiguredRouter with stop, which ends the
// router as SIGTERM does (its drain, within a second) and returns once it
// has; the test's end stops it too.
func runConfiguredRouter(t *testing.T, cfg fileConfig) (url string, stop func()) {
	t.Helper()
	applyDefaults(&cfg)
	if err := validate(cfg); err != nil {
		t.Fatal(err)
	}
	r, err := newRouter(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.run(ctx, ln, time.Second); close(done) }() //nolint:errcheck
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return "http://" + ln.Addr().String(), stop
}

// A throttled GPU takes proportionally less traffic, and a replica whose GPU
// reported an Xid error takes none — end to end, from the simulator's GPU
// endpoint (the agent's JSON shape) through the poller to the policy.
func TestGPUAwareRoutingEndToEnd(t *testing.T) {
	fleet := startSimFleet(t, 3, []sim.Faults{{}, {ThrottleReasons: []string{"hw_thermal_slowdown"}}, {XidErrors: 1}})
	cfg := fileConfig{
		Log:       logConfig{Level: "error"},
		Telemetry: telemetryConfig{Interval: 50 * time.Millisecond, GPUInterval: 50 * time.Millisecond},
		Pools:     []poolConfig{{Model: "m", Policy: "least_loaded"}},
	}
	for i, u := range fleet.URLs() {
		var rep gpu.HostReport
		getJSON(t, u+"/v1/gpus", &rep)
		cfg.Pools[0].Replicas = append(cfg.Pools[0].Replicas, replicaConfig{
			URL: u, Name: fmt.Sprintf("r%d", i), GPU: &gpuConfig{AgentURL: u, UUID: rep.GPUs[0].UUID},
		})
	}
	router := startConfiguredRouter(t, cfg)

	// Wait (bounded) until the router has every replica's GPU snapshot.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var pools struct {
			Pools []struct {
				Replicas []struct {
					GPU *struct{ CapacityFactor float64 } `json:"gpu"`
				} `json:"replicas"`
			} `json:"pools"`
		}
		getJSON(t, router+"/debug/pools", &pools)
		ready := 0
		for _, r := range pools.Pools[0].Replicas {
			if r.GPU != nil {
				ready++
			}
		}
		if ready == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GPU telemetry never arrived: %+v", pools)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// 48 concurrent streams that stay in flight while the others arrive.
	const n = 48
	counts := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"model":"m","stream":true,"max_tokens":200,"ignore_eos":true,"messages":[{"role":"user","content":"hello"}]}`
			resp, err := http.Post(router+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			counts[resp.Header.Get("X-Gpurouter-Replica")]++
			mu.Unlock()
		}()
		time.Sleep(15 * time.Millisecond) // arrivals spread over ~0.7 s, like traffic
	}
	wg.Wait()
	t.Logf("requests per replica: %v", counts)
	if counts["r2"] != 0 {
		t.Errorf("replica with an Xid error got %d requests: %v", counts["r2"], counts)
	}
	if counts["r1"] >= counts["r0"] || counts["r1"] == 0 {
		t.Errorf("throttled replica should get less (but some) traffic: %v", counts)
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}
