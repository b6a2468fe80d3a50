package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestDemoShortRun runs `gpurouter demo` for a few seconds on a fast
// profile and checks the three sections, the files, and that everything it
// started has stopped.
func TestDemoShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a simulated fleet and the router for several seconds")
	}
	out := filepath.Join(t.TempDir(), "demo")
	var stdout, stderr bytes.Buffer
	code := run([]string{"demo", "--duration", "3s", "--rate", "5", "--replicas", "2", "--profile", "llama3-8b-h200", "--out", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	text := stdout.String()
	for _, want := range []string{
		"Serving Benchmark Result", "Failed requests:                         0",
		"Client vs Router vs Engine Latency", "Completed requests matched:              15 of 15",
		"sim-1-speed-0.5", "Where the Mean Request's Time Goes", "Residual (ms):",
		"ITL percentiles: its sketch of every gap", // exact router ITL (issue 19)
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	// No percentile is interpolated inside a first bucket (0–b): those
	// print as "≤ b".
	if strings.Contains(text, "[0–") {
		t.Errorf("a percentile interpolated inside a histogram's first bucket:\n%s", text)
	}
	for _, f := range []string{"report.md", "result.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(out, "result.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res map[string]any
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res["completed"] != 15.0 || res["gpurouter_router"] != true || res["gpurouter_decomposition_ms"] == nil {
		t.Errorf("result.json: completed %v, router %v, decomposition %v", res["completed"], res["gpurouter_router"], res["gpurouter_decomposition_ms"])
	}

	// Everything demo started has stopped: no goroutine runs gpurouter code
	// (replicas, their engine loops, the router, its health checker, the
	// load generator). fasthttp's idle-connection and worker-pool cleaners
	// outlive their clients and servers by up to their sleep and are not
	// ours to wait for.
	// A goroutine that has signalled its WaitGroup may still be on its way
	// out (seen: one parked just past sim.Fleet.Run's wg.Done), so the check
	// allows it a moment, bounded.
	left := ourGoroutines()
	for deadline := time.Now().Add(2 * time.Second); len(left) > 0 && time.Now().Before(deadline); left = ourGoroutines() {
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("%d goroutines still running gpurouter code after demo returned:\n%s", len(left), strings.Join(left, "\n\n"))
	}
}

// ourGoroutines returns the stacks of goroutines running gpurouter code,
// other than the test's own.
func ourGoroutines() []string {
	buf := make([]byte, 4<<20)
	var left []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		// The test binary's main goroutine waits in this package's TestMain.
		if strings.Contains(g, "github.com/gpurouter/gpurouter/") && !strings.Contains(g, "TestDemoShortRun") && !strings.Contains(g, "gpurouter.TestMain(") {
			left = append(left, g)
		}
	}
	return left
}

func TestDemoRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"negative duration", []string{"--duration", "-1s"}, "--duration"},
		{"zero rate", []string{"--rate", "0"}, "--rate"},
		{"no replicas", []string{"--replicas", "0"}, "--replicas"},
		{"unknown profile", []string{"--profile", "nope"}, "nope"},
		{"stray argument", []string{"extra"}, "unexpected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(append([]string{"demo"}, tt.args...), &stdout, &stderr); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.want)
			}
		})
	}
}
