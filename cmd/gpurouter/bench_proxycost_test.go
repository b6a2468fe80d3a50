package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// childEnv makes the test binary act as gpurouter itself (TestMain), so a
// test can start the router as a subprocess, the way bench proxy-cost
// measures it, without building a binary.
const childEnv = "GPUROUTER_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestBenchProxyCostTiny runs `gpurouter bench proxy-cost` tiny — direct, a
// gpurouter subprocess, the bare fasthttp proxy and (on Linux) the epoll
// loop, a few hundred requests
// on loopback — so the harness stays working; what it measures is not
// judged.
func TestBenchProxyCostTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a router subprocess")
	}
	t.Setenv(childEnv, "1")
	jsonPath := filepath.Join(t.TempDir(), "cost.json")
	var stdout, stderr bytes.Buffer
	code := run([]string{"bench", "proxy-cost", "--gpurouter-bin", os.Args[0],
		"--haproxy=false", "--nginx=false", "--reps", "1", "--duration", "300ms", "--c1-duration", "150ms",
		"--concurrency", "4", "--streams", "4", "--events", "10", "--idle-streams", "40", "--warmup", "200ms",
		"--retries", "-1", "--json", jsonPath}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	names := []string{"direct", "gpurouter", "fasthttp-bare"}
	if runtime.GOOS == "linux" {
		names = append(names, "epoll-bare")
	}
	if !strings.Contains(stdout.String(), "| | "+strings.Join(names, " | ")+" |") {
		t.Fatalf("no table with both targets:\n%s", stdout.String())
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Runs    int `json:"runs"`
		Figures []struct {
			Name        string  `json:"name"`
			Measured    bool    `json:"measured"`
			CPUPerReqUs float64 `json:"cpu_per_request_c64_us"`
			CPUPerEvent float64 `json:"cpu_per_event_us"`
			ReqPerSec   float64 `json:"requests_per_second_c64"`
		} `json:"figures"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Figures) != len(names) {
		t.Fatalf("figures: %s", b)
	}
	for i, g := range got.Figures {
		if g.Name != names[i] {
			t.Fatalf("figure %d is %s, want %s: %s", i, g.Name, names[i], b)
		}
	}
	for _, g := range got.Figures[1:] {
		if !g.Measured || g.ReqPerSec <= 0 || g.CPUPerReqUs <= 0 {
			t.Fatalf("%s unmeasured (its CPU is read from /proc): %s", g.Name, b)
		}
	}
	if want := 3 * len(names); got.Runs != want { // c=1, c=64 and SSE each
		t.Fatalf("%d runs, want %d", got.Runs, want)
	}
}

// TestBenchProxyCostRefusesAnUnknownWorkload: a typo in --workloads is a
// usage error before anything starts, not a run that measures nothing.
func TestBenchProxyCostRefusesAnUnknownWorkload(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bench", "proxy-cost", "--workloads", "c1,c=64"}, &stdout, &stderr); code != 2 {
		t.Fatalf("exit %d, want 2\n%s\n%s", code, stdout.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), `unknown workload "c=64"`) {
		t.Fatalf("stderr does not name the workload:\n%s", stderr.String())
	}
}
