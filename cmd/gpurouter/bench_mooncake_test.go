package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Mooncake trace replayed against a simulated engine: the rows the max
// model length cannot take are dropped with one line, the ideal prefix-cache
// hit rate is printed and saved, and the engine's KV use and prefix-cache
// hits over the run land in the result file.
func TestBenchMooncakeReplay(t *testing.T) {
	fleet := startSimFleet(t, 1, nil)
	dir := t.TempDir()
	code, out, errOut := runCmd(t, "bench", "--base-url", fleet.URLs()[0], "--model", "m", "--dataset-name", "mooncake",
		"--dataset-path", "../../bench/testdata/mooncake_small.jsonl", "--time-scale", "100", "--max-model-len", "1502",
		"--max-concurrency", "1", "--disable-tqdm", "--save-result", "--result-dir", dir, "--result-filename", "r.json")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"dropped 1 of 4 requests longer than --max-model-len 1502", "ideal prefix-cache hit rate of these 3 requests (one shared unbounded cache): 0.286"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if !strings.Contains(out, "Engines over the run") {
		t.Errorf("no engine usage in the output:\n%s", out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "r.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Completed int     `json:"completed"`
		Dropped   int     `json:"gpurouter_dataset_dropped"`
		Ideal     float64 `json:"gpurouter_ideal_prefix_cache_hit_rate"`
		Usage     []struct {
			Hits    float64  `json:"prefix_cache_hits"`
			Queries float64  `json:"prefix_cache_queries"`
			KV      *float64 `json:"mean_kv_usage"`
			Samples int      `json:"kv_samples"`
		} `json:"gpurouter_engine_usage"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	// Sent one at a time: [1 2 4] finds [1 2] of [1 2 3] in the cache.
	if res.Completed != 3 || res.Dropped != 1 || res.Ideal != 2.0/7 || len(res.Usage) != 1 ||
		res.Usage[0].Hits != 1024 || res.Usage[0].Queries != 1500+1100+300 || res.Usage[0].KV == nil || res.Usage[0].Samples < 2 {
		t.Fatalf("result %+v", res)
	}
}
