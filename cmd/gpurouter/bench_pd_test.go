package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurouter/gpurouter/bench/sim"
)

// runKVSim runs one simulated replica with a NixlConnector of role until
// the test ends.
func runKVSim(t *testing.T, role sim.KVRole) string {
	t.Helper()
	p, err := sim.Builtin("tinyllama-1.1b-a10")
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.NewFleet(sim.FleetConfig{Replicas: 1, Profiles: []sim.Profile{p}, ServedModelNames: []string{"m"},
		Speeds: []float64{4}, KVTransfer: &sim.KVTransferConfig{Role: role}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }() //nolint:errcheck
	t.Cleanup(func() { cancel(); <-done })
	return f.URLs()[0]
}

// --engine-url prefill=URL / decode=URL: the run prints each role's phases
// and saves them; the prefill engine stays out of the engine column. (No
// router drives the split yet: the requests here go to the decode replica
// whole, so the prefill side sees none.)
func TestBenchEngineRoles(t *testing.T) {
	p, d := runKVSim(t, sim.KVProducer), runKVSim(t, sim.KVConsumer)
	dir := t.TempDir()
	code, out, errOut := runCmd(t, "bench", "--base-url", d, "--model", "m", "--dataset-name", "random",
		"--random-input-len", "32", "--random-output-len", "8", "--ignore-eos", "--num-prompts", "12", "--max-concurrency", "4",
		"--seed", "3", "--disable-tqdm", "--engine-url", "prefill="+p, "--engine-url", "decode="+d,
		"--save-result", "--result-dir", dir, "--result-filename", "r.json")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "Prefill/Decode Phases (engines)") {
		t.Errorf("no phases in\n%s", out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "r.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		PD struct {
			Prefill struct{ Requests float64 } `json:"prefill"`
			Decode  struct{ Requests float64 } `json:"decode"`
			Reads   float64                    `json:"kv_reads"`
		} `json:"gpurouter_pd_phases"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.PD.Decode.Requests != 12 || res.PD.Prefill.Requests != 0 || res.PD.Reads != 0 {
		t.Errorf("gpurouter_pd_phases %+v", res.PD)
	}

	if code, _, errOut := runCmd(t, "bench", "--base-url", d, "--engine-url", "middle="+d); code != 2 ||
		!strings.Contains(errOut, "want prefill or decode") {
		t.Errorf("a bad role: exit %d, %s", code, errOut)
	}
}
