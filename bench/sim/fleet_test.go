package sim

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// TestFleetStopsCleanly cancels a fleet while streams, queued requests and
// hung requests are in flight: Run must return promptly, every connection
// must be closed, and no goroutine may be left behind.
func TestFleetStopsCleanly(t *testing.T) {
	f, err := NewFleet(FleetConfig{Replicas: 2, Profiles: []Profile{mustBuiltin(t, "qwen2.5-7b")},
		ServedModelNames: []string{"qwen"}, Estimator: testEstimator(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if err := f.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- f.Run(ctx) }()
	u0, u1 := f.URLs()[0], f.URLs()[1]
	stream := openStream(t, u0, "/v1/completions", `{"model":"qwen","stream":true,"prompt":"a","max_tokens":5000,"ignore_eos":true}`)
	defer stream.close()
	stream.readHeader(t)
	stream.next(t)
	long := openStream(t, u0, "/v1/completions", `{"model":"qwen","prompt":"`+strings.Repeat("w ", 20000)+`","max_tokens":5}`)
	defer long.close()
	if err := f.Replicas()[1].SetFaults(Faults{Hang: true}); err != nil {
		t.Fatal(err)
	}
	hung := openStream(t, u1, "/v1/completions", `{"model":"qwen","prompt":"a","max_tokens":5}`)
	defer hung.close()
	waitFor(t, 2*time.Second, "requests in flight", func() bool {
		return f.Replicas()[0].State().Running == 2 && f.Replicas()[1].waiting.len() == 1
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	for _, s := range []*rawStream{stream, long, hung} {
		_ = s.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, s.br); isTimeout(err) {
			t.Error("a connection stayed open after shutdown")
		}
	}
	if _, err := net.Dial("tcp", strings.TrimPrefix(u0, "http://")); err == nil {
		t.Error("still listening after shutdown")
	}
	waitNoSimGoroutines(t, 5*time.Second)
}

// waitNoSimGoroutines waits until no goroutine of this package or of
// fasthttp is left, apart from test goroutines and fasthttp's process-wide
// date updater.
func waitNoSimGoroutines(t *testing.T, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		buf := make([]byte, 1<<20)
		stacks := strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
		var left []string
		for _, s := range stacks {
			if strings.Contains(s, "testing.tRunner") || strings.Contains(s, "updateServerDate") {
				continue
			}
			if strings.Contains(s, "fasthttp") || strings.Contains(s, "gpurouter/bench/sim") {
				left = append(left, s)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHeterogeneousSpeeds gives two replicas the same work at speeds 1 and
// 0.5: the slower one's modelled steps take exactly twice as long.
func TestHeterogeneousSpeeds(t *testing.T) {
	f := startFleet(t, FleetConfig{Replicas: 2, Profiles: []Profile{mustBuiltin(t, "tinyllama-1.1b-a10")},
		Speeds: []float64{4, 2}, ServedModelNames: []string{"m"}})
	var sums [2]float64
	for i, u := range f.URLs() {
		httpDo(t, "POST", u+"/v1/completions", `{"model":"m","prompt":"same work","max_tokens":20,"ignore_eos":true}`)
		mfs, err := f.Replicas()[i].Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "gpurouter_sim_step_duration_seconds" {
				sums[i] = histSum(mf.GetMetric()[0])
			}
		}
	}
	if ratio := sums[1] / sums[0]; ratio < 1.99 || ratio > 2.01 {
		t.Errorf("step time ratio %v (sums %v), want 2", ratio, sums)
	}
}

func histSum(m *dto.Metric) float64 { return m.GetHistogram().GetSampleSum() }

func TestFleetConfigErrors(t *testing.T) {
	p := mustBuiltin(t, "qwen2.5-7b")
	for _, c := range []FleetConfig{
		{Replicas: 0, Profiles: []Profile{p}},
		{Replicas: 3, Profiles: []Profile{p, p}},
		{Replicas: 2, Profiles: []Profile{p}, Speeds: []float64{1, 1, 1}},
		{Replicas: 1},
		{Replicas: 1, Profiles: []Profile{p}, Speeds: []float64{-1}},
	} {
		c.Estimator = testEstimator(t)
		if _, err := NewFleet(c); err == nil {
			t.Errorf("NewFleet(%+v) accepted", c)
		}
	}
	// A busy port is reported and nothing stays bound.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	f, err := NewFleet(FleetConfig{Replicas: 2, BasePort: port - 1, Profiles: []Profile{p}, Estimator: testEstimator(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = f.Listen()
	if err == nil {
		t.Fatal("Listen on a busy port succeeded")
	}
	// Replica 1 must fail on the held port (unless something else holds
	// port-1, making replica 0 fail first); replica 0's port is released.
	if strings.Contains(err.Error(), "replica 1") {
		l0, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port-1)))
		if err != nil {
			t.Errorf("replica 0's port still bound after the failed Listen: %v", err)
		} else {
			l0.Close()
		}
	} else if !strings.Contains(err.Error(), "replica 0") {
		t.Errorf("Listen error %v", err)
	}
}

func TestBuiltinsAndYAML(t *testing.T) {
	for _, name := range ProfileNames() {
		p := mustBuiltin(t, name)
		if err := p.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p, err := LoadProfile(write("over.yaml", `
base: llama3-8b-h100
name: my-llama
engine:
  max_num_seqs: 64
  kv_cache_dtype: fp8
overheads:
  per_seq: 100us
`))
	if err != nil {
		t.Fatal(err)
	}
	base := mustBuiltin(t, "llama3-8b-h100")
	if p.Name != "my-llama" || p.Engine.MaxNumSeqs != 64 || p.Overheads.PerSeq != 100*time.Microsecond ||
		p.Model.Name != base.Model.Name || !p.Engine.EnableChunkedPrefill || p.NumGPUBlocks() <= base.NumGPUBlocks() {
		t.Errorf("loaded %+v", p)
	}
	full, err := LoadProfile(write("full.yaml", `
name: custom
hardware: {name: X1, memory_gib: 48, memory_bandwidth_gbps: 1000, bf16_tflops: 200, bandwidth_efficiency: 0.8, compute_efficiency: 0.6}
model: {name: org/model-3b, params_billion: 3, kv_bytes_per_token: 65536, max_model_len: 8192, output_len: {median: 100, sigma: 0.5}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if full.Engine.MaxNumSeqs != 256 || full.Engine.BlockSize != 16 || !full.Engine.EnablePrefixCaching {
		t.Errorf("vLLM defaults not applied: %+v", full.Engine)
	}
	for name, body := range map[string]string{
		"unknown.yaml":  "base: qwen2.5-7b\nengine: {max_num_seqz: 3}\n",
		"nobase.yaml":   "base: nope\n",
		"invalid.yaml":  "base: qwen2.5-7b\nengine: {gpu_memory_utilization: 2}\n",
		"toolong.yaml":  "base: llama3-8b-a10\nengine: {max_model_len: 8192, gpu_memory_utilization: 0.75}\n",
		"notfound.yaml": "",
	} {
		path := filepath.Join(dir, name)
		if body != "" {
			path = write(name, body)
		}
		if _, err := LoadProfile(path); err == nil {
			t.Errorf("%s loaded", name)
		} else if errors.Is(err, os.ErrNotExist) != (body == "") {
			t.Errorf("%s: %v", name, err)
		}
	}
}
