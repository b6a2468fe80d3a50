package main

// Helpers of the operators' tests (operators_prom_test.go,
// operators_status_test.go): a fleet of simulated replicas with GPU
// telemetry behind a router under steady load, and the real programs that
// look at it — Prometheus, promtool and headless Chromium — each started
// in its own temporary directory on a loopback port, bounded in time and
// killed when the test ends.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
	"github.com/gpurouter/gpurouter/gpu"
)

// needBinary finds an external program a test runs. Where it is missing
// the test is skipped with one line, except under CI=true, where .ci/run
// installs it and its absence is a failure.
func needBinary(t *testing.T, name, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not found (CI=true): .ci/run installs the Debian package %s", name, debianPackage)
	}
	t.Skipf("%s not installed (Debian package %s)", name, debianPackage)
	return ""
}

// startProcess runs a program until the test ends, in its own process
// group so that its children die with it; its output goes to logPath.
func startProcess(t *testing.T, logPath, name string, args ...string) *exec.Cmd {
	t.Helper()
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	ownGroup(cmd)
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		killGroup(cmd) //nolint:errcheck // the group may be gone already
		cmd.Wait()     //nolint:errcheck // killed
		logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil && len(b) > 0 {
				t.Logf("%s output (last 3000 bytes):\n%s", name, tail(b, 3000))
			}
		}
	})
	return cmd
}

// runBounded runs a program to completion within limit, killing its whole
// process group (Chromium's helpers included) when the limit passes, and
// returns its stdout and stderr.
func runBounded(t *testing.T, limit time.Duration, stdin io.Reader, name string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr strings.Builder
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &stdout, &stderr
	ownGroup(cmd)
	cmd.Cancel = func() error { return killGroup(cmd) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		killGroup(cmd) //nolint:errcheck // leftovers of the group, if any
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("%s ran past %v: %w", name, limit, ctx.Err())
	}
	return stdout.String(), stderr.String(), err
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// freeAddr is a loopback address nobody listens on (a moment ago).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// observedFleet is n simulated replicas behind a router, each replica's
// GPU read through the simulator's agent endpoint, its replicas named by
// the default (host:port, which is also the instance Prometheus gives the
// engine), and the pool split between two A/B arms.
type observedFleet struct {
	router  string   // http://host:port
	engines []string // the replicas' host:port
	names   []string // the replicas' names in the router
}

// startObservedFleet starts the fleet; faults[i] applies to replica i.
// adminToken, when set, guards the status page.
func startObservedFleet(t *testing.T, n int, faults []sim.Faults, adminToken string) *observedFleet {
	t.Helper()
	fleet := startSimFleet(t, n, faults)
	cfg := fileConfig{
		Log:       logConfig{Level: "error"},
		Health:    healthConfig{Interval: 100 * time.Millisecond, Timeout: 500 * time.Millisecond},
		Telemetry: telemetryConfig{Interval: 100 * time.Millisecond, GPUInterval: 200 * time.Millisecond},
		Admin:     adminConfig{Token: adminToken},
		Pools: []poolConfig{{Model: "m", Arms: []armConfig{
			{Name: "least-loaded", Policy: "least_loaded", Share: 1},
			{Name: "round-robin", Policy: "round_robin", Share: 1},
		}}},
	}
	of := &observedFleet{}
	for _, u := range fleet.URLs() {
		var rep gpu.HostReport
		getJSON(t, u+"/v1/gpus", &rep)
		cfg.Pools[0].Replicas = append(cfg.Pools[0].Replicas, replicaConfig{URL: u, GPU: &gpuConfig{AgentURL: u, UUID: rep.GPUs[0].UUID}})
		hostPort := strings.TrimPrefix(u, "http://")
		of.engines = append(of.engines, hostPort)
		of.names = append(of.names, hostPort)
	}
	of.router = startConfiguredRouter(t, cfg)
	return of
}

// load sends streaming chat requests to the router, about rate per second
// with up to 16 in flight, until the test ends.
func (of *observedFleet) load(t *testing.T, rate float64) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	client := &http.Client{Timeout: 30 * time.Second}
	slots := make(chan struct{}, 16)
	body := `{"model":"m","stream":true,"max_tokens":24,"ignore_eos":true,"messages":[{"role":"user","content":"what do operators look at?"}]}`
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			select {
			case slots <- struct{}{}:
			default:
				continue // 16 in flight: skip this arrival
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				req, _ := http.NewRequestWithContext(ctx, "POST", of.router+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					return // the test ending cancels requests in flight
				}
				io.Copy(io.Discard, resp.Body) //nolint:errcheck
				resp.Body.Close()
			}()
		}
	}()
}

// prometheus is a Prometheus server started for one test.
type prometheusServer struct {
	url string
}

// startPrometheus runs Prometheus on a loopback port with its own data
// directory, scraping each job's targets every second and evaluating
// ruleFiles every second, and waits (bounded) until it is ready.
func startPrometheus(t *testing.T, bin string, jobs map[string][]string, ruleFiles []string) *prometheusServer {
	t.Helper()
	dir := t.TempDir()
	var cfg strings.Builder
	cfg.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n")
	if len(ruleFiles) > 0 {
		cfg.WriteString("rule_files:\n")
		for _, f := range ruleFiles {
			abs, err := filepath.Abs(f)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&cfg, "  - %q\n", abs)
		}
	}
	cfg.WriteString("scrape_configs:\n")
	for job, targets := range jobs {
		quoted := make([]string, len(targets))
		for i, tg := range targets {
			quoted[i] = fmt.Sprintf("%q", tg)
		}
		fmt.Fprintf(&cfg, "  - job_name: %q\n    static_configs:\n      - targets: [%s]\n", job, strings.Join(quoted, ", "))
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	startProcess(t, filepath.Join(dir, "prometheus.log"), bin,
		"--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	p := &prometheusServer{url: "http://" + addr}
	waitUntil(t, 30*time.Second, "Prometheus ready", func() bool {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// promSample is one element of an instant query's result.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant query; a query Prometheus refuses is an error.
func (p *prometheusServer) query(expr string) ([]promSample, error) {
	resp, err := http.Get(p.url + "/api/v1/query?" + url.Values{"query": {expr}}.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var doc struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string       `json:"resultType"`
			Result     []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, err
	}
	if doc.Status != "success" {
		return nil, fmt.Errorf("%s", doc.Error)
	}
	return doc.Data.Result, nil
}

// waitUntil polls cond every 200 ms until it holds, failing the test after
// limit; why, when given, is what cond last found wrong.
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool, why ...*string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			detail := ""
			for _, w := range why {
				detail += ": " + *w
			}
			t.Fatalf("%s: not within %v%s", what, limit, detail)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
