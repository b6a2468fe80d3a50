package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurouter/gpurouter/bench/sim"
)

// An adapter workload against a simulated replica serving LoRA: requests
// name adapters by Zipf's law, the report has latency per adapter, and
// the engine's swaps over the run land in the output and the result file.
func TestBenchLoRAAdapters(t *testing.T) {
	p, err := sim.Builtin("tinyllama-1.1b-a10")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"enable-lora", "true"}, {"max-loras", "2"}, {"max-cpu-loras", "3"}} {
		if err := p.Set(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	var mods []sim.LoRAModule
	for i := range 6 {
		names = append(names, fmt.Sprintf("a%d", i))
		mods = append(mods, sim.LoRAModule{Name: names[i], Path: "/adapters/" + names[i]})
	}
	fleet, err := sim.NewFleet(sim.FleetConfig{Replicas: 1, Profiles: []sim.Profile{p}, ServedModelNames: []string{"m"},
		Speeds: []float64{4}, LoRAModules: mods})
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fleet.Run(ctx); close(done) }() //nolint:errcheck
	t.Cleanup(func() { cancel(); <-done })

	dir := t.TempDir()
	code, out, errOut := runCmd(t, append([]string{"bench", "--base-url", fleet.URLs()[0], "--model", "m",
		"--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "8", "--ignore-eos", "--num-prompts", "40",
		"--max-concurrency", "8", "--seed", "3", "--disable-tqdm", "--lora-zipf", "1", "--lora-modules"},
		append(names, "--save-result", "--result-dir", dir, "--result-filename", "r.json")...)...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "requests go to 6 LoRA adapters by Zipf(1): a0 40.8% of them, a5 6.8%") {
		t.Errorf("stderr:\n%s", errOut)
	}
	for _, want := range []string{"Latency by Adapter (ms)", "LoRA swaps on the engines:", "LoRA swaps "} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "r.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Completed int      `json:"completed"`
		Adapters  []string `json:"gpurouter_lora_adapters"`
		Models    []string `json:"gpurouter_models"`
		Latency   []struct {
			Name     string `json:"name"`
			Requests int    `json:"requests"`
		} `json:"gpurouter_adapter_latency"`
		Swaps struct {
			CPU, Disk float64
			Requests  int     `json:"requests"`
			PerK      float64 `json:"per_1000_requests"`
		} `json:"gpurouter_lora_swaps"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, l := range res.Latency {
		sum += l.Requests
	}
	if res.Completed != 40 || len(res.Adapters) != 6 || len(res.Models) != 40 || sum != 40 || len(res.Latency) == 0 ||
		res.Swaps.Requests != 40 || res.Swaps.CPU+res.Swaps.Disk == 0 || res.Swaps.PerK != 1000*(res.Swaps.CPU+res.Swaps.Disk)/40 {
		t.Errorf("result %+v", res)
	}
}

func TestBenchLoRAFlagErrors(t *testing.T) {
	weights := filepath.Join(t.TempDir(), "w.txt")
	if err := os.WriteFile(weights, []byte("a 1\nb x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--lora-zipf", "1"}, "need --lora-modules or --lora-weights"},
		{[]string{"--lora-modules", "a", "--lora-zipf", "-1"}, "Zipf exponent -1"},
		{[]string{"--lora-modules", "a", "--lora-assignment", "sticky"}, `--lora-assignment "sticky"`},
		{[]string{"--lora-modules", "a", "--lora-assignment", "round-robin", "--lora-zipf", "1"}, "round-robin sends to every adapter"},
		{[]string{"--lora-weights", weights}, `"x" is not a weight`},
		{[]string{"--lora-weights", weights, "--lora-modules", "a"}, "no --lora-modules or --lora-zipf with it"},
	} {
		code, _, errOut := runCmd(t, append(append([]string{"bench", "--base-url", "http://127.0.0.1:1"}, smallWorkload(2)...), c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q: want 2 and %q", c.args, code, errOut, c.want)
		}
	}
	got := expandLoRANames([]string{"--lora-modules", "a", "b,c", "--seed", "1", "-lora-modules", "d"})
	if strings.Join(got, "|") != "--lora-modules|a b,c|--seed|1|-lora-modules|d" {
		t.Errorf("expanded %q", got)
	}
}
