//go:build cgo

package gpu

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap/zapcore"
)

// newTestAgent serves an Agent over the fake host h on a loopback server.
func newTestAgent(t *testing.T, h *fakeHost, cfg AgentConfig) (*httptest.Server, *NVML) {
	t.Helper()
	n := NewNVML(h, cfg.Log)
	t.Cleanup(func() { n.Close() })
	cfg.Source = NewNVMLSource(n, Selector{})
	if cfg.Host == "" {
		cfg.Host = "gpu-node-7"
	}
	a, err := NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return srv, n
}

// The agent's JSON, decoded by an AgentSource on another host, gives back
// exactly what NVML read on this one.
func TestAgentRoundTrip(t *testing.T) {
	t.Parallel()
	h := newFakeHost(8)
	h.set(5, func(g *fakeGPU) { g.reasons, g.ecc = nvml.ClocksThrottleReasonHwSlowdown, 1 })
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	srv, n := newTestAgent(t, h, AgentConfig{Now: func() time.Time { return at }})
	h.xid(5, 79)

	direct, err := n.Read(Selector{})
	if err != nil {
		t.Fatal(err)
	}
	code, body := httpGet(t, srv.URL+"/v1/gpus")
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	var rep HostReport
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Host != "gpu-node-7" || !rep.At.Equal(at) || len(rep.GPUs) != 8 {
		t.Errorf("report header: host %q at %v, %d GPUs", rep.Host, rep.At, len(rep.GPUs))
	}
	if rep.GPUs[5].XidErrors != 1 || direct[5].XidErrors != 1 {
		t.Errorf("Xid: report %d, direct %d", rep.GPUs[5].XidErrors, direct[5].XidErrors)
	}
	if !reflect.DeepEqual(rep.GPUs, direct) {
		t.Errorf("report differs from NVML:\n got %+v\nwant %+v", rep.GPUs, direct)
	}

	for _, tc := range []struct {
		name string
		sel  Selector
		want []GPUStats
	}{
		{"whole host", Selector{}, direct},
		{"one GPU by UUID", Selector{UUIDs: []string{direct[5].UUID}}, direct[5:6]},
		{"tensor-parallel pair by index", Selector{Indexes: []int{2, 3}}, direct[2:4]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := NewAgentSource(srv.URL, tc.sel, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := src.Fetch(ctxTimeout(t))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	src, _ := NewAgentSource(srv.URL+"/v1/gpus", Selector{UUIDs: []string{"GPU-elsewhere"}}, nil)
	if _, err := src.Fetch(ctxTimeout(t)); !errors.Is(err, ErrGPUNotFound) {
		t.Errorf("UUID on another host: %v", err)
	}
}

func TestAgentMetrics(t *testing.T) {
	t.Parallel()
	h := newFakeHost(2)
	h.set(1, func(g *fakeGPU) { g.reasons = nvml.ClocksEventReasonSwPowerCap })
	srv, _ := newTestAgent(t, h, AgentConfig{})
	code, body := httpGet(t, srv.URL+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	mfs := parseExposition(t, body)
	uuid1 := h.gpus[1].uuid
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"gpurouter_gpu_telemetry_enabled", nil, 1},
		{"gpurouter_gpu_read_ok", nil, 1},
		{"gpurouter_gpu_utilization_ratio", map[string]string{"uuid": uuid1, "index": "1"}, 0.1},
		{"gpurouter_gpu_memory_used_bytes", map[string]string{"index": "1"}, 1 << 30},
		{"gpurouter_gpu_memory_total_bytes", map[string]string{"index": "1"}, 42949672960},
		{"gpurouter_gpu_power_watts", map[string]string{"index": "1"}, 91},
		{"gpurouter_gpu_power_limit_watts", map[string]string{"index": "1"}, 400},
		{"gpurouter_gpu_temperature_celsius", map[string]string{"index": "1"}, 31},
		{"gpurouter_gpu_sm_clock_hertz", map[string]string{"index": "1"}, 1410e6},
		{"gpurouter_gpu_sm_clock_max_hertz", map[string]string{"index": "0"}, 1410e6},
		{"gpurouter_gpu_clock_slowdown", map[string]string{"index": "1", "reason": "sw_power_cap"}, 1},
		{"gpurouter_gpu_clock_slowdown", map[string]string{"index": "1", "reason": "hw_thermal_slowdown"}, 0},
		{"gpurouter_gpu_clock_slowdown", map[string]string{"index": "0", "reason": "sw_power_cap"}, 0},
		{"gpurouter_gpu_xid_errors_total", map[string]string{"index": "0"}, 0},
		{"gpurouter_gpu_ecc_uncorrected_errors_total", map[string]string{"index": "0"}, 0},
		{"gpurouter_gpu_info", map[string]string{"index": "0", "name": "Mock NVIDIA A100-SXM4-40GB"}, 1},
	} {
		if got, ok := seriesValue(mfs, tc.name, tc.labels); !ok || got != tc.want {
			t.Errorf("%s%v = %v (found %v), want %v", tc.name, tc.labels, got, ok, tc.want)
		}
	}
	if n := len(mfs["gpurouter_gpu_clock_slowdown"].GetMetric()); n != 2*len(SlowdownReasonNames()) {
		t.Errorf("%d slowdown series, want one per GPU and reason", n)
	}
}

// Without a driver the agent still serves: an empty list, telemetry_enabled 0.
func TestAgentWithoutGPU(t *testing.T) {
	t.Parallel()
	h := newFakeHost(0)
	h.initRet = nvml.ERROR_LIBRARY_NOT_FOUND
	log, logs := observedLogger(zapcore.DebugLevel)
	srv, _ := newTestAgent(t, h, AgentConfig{Log: log})
	for range 3 {
		code, body := httpGet(t, srv.URL+"/v1/gpus")
		if code != http.StatusOK || !bytes.Contains(body, []byte(`"gpus":[]`)) {
			t.Errorf("status %d body %s", code, body)
		}
	}
	_, body := httpGet(t, srv.URL+"/metrics")
	mfs := parseExposition(t, body)
	if v, ok := seriesValue(mfs, "gpurouter_gpu_telemetry_enabled", nil); !ok || v != 0 {
		t.Errorf("telemetry_enabled = %v %v", v, ok)
	}
	if _, ok := mfs["gpurouter_gpu_utilization_ratio"]; ok {
		t.Error("utilisation series without GPUs")
	}
	if logs.Len() != 1 || logs.All()[0].Message != "GPU telemetry off: libnvidia-ml.so.1 not found" {
		t.Errorf("logs: %v", logs.All())
	}
	all, _ := NewAgentSource(srv.URL, Selector{}, nil)
	if gpus, err := all.Fetch(ctxTimeout(t)); err != nil || len(gpus) != 0 {
		t.Errorf("whole host without GPUs: %v %v", gpus, err)
	}
	one, _ := NewAgentSource(srv.URL, Selector{Indexes: []int{0}}, nil)
	if _, err := one.Fetch(ctxTimeout(t)); !errors.Is(err, ErrGPUNotFound) {
		t.Errorf("a GPU of a host without telemetry: %v", err)
	}
}

// A failing read is a 503 for the remote router, and is logged once per
// change, not per request.
func TestAgentReadFailure(t *testing.T) {
	t.Parallel()
	h := newFakeHost(1)
	log, logs := observedLogger(zapcore.InfoLevel)
	srv, n := newTestAgent(t, h, AgentConfig{Log: log})
	if err := n.Open(); err != nil {
		t.Fatal(err)
	}
	h.set(0, func(g *fakeGPU) { g.lost = true })
	src, _ := NewAgentSource(srv.URL, Selector{}, nil)
	for range 3 {
		if _, err := src.Fetch(ctxTimeout(t)); !errors.Is(err, ErrHTTPStatus) {
			t.Errorf("err = %v", err)
		}
	}
	h.set(0, func(g *fakeGPU) { g.lost = false })
	if _, err := src.Fetch(ctxTimeout(t)); err != nil {
		t.Fatal(err)
	}
	if got := logs.FilterMessage("GPU read failing").Len(); got != 1 {
		t.Errorf("%d failing lines, want 1", got)
	}
	if got := logs.FilterMessage("GPU read recovered").Len(); got != 1 {
		t.Errorf("%d recovered lines, want 1", got)
	}
}

func TestAgentConfigAndURLs(t *testing.T) {
	t.Parallel()
	if _, err := NewAgent(AgentConfig{}); err == nil {
		t.Error("NewAgent without a Source")
	}
	for _, u := range []string{"", "ftp://x", "http://", "://"} {
		if _, err := NewAgentSource(u, Selector{}, nil); err == nil {
			t.Errorf("NewAgentSource(%q) accepted", u)
		}
	}
	s, err := NewAgentSource("http://10.0.0.5:9401", Selector{}, nil)
	if err != nil || s.url != "http://10.0.0.5:9401/v1/gpus" {
		t.Errorf("%v %q", err, s.url)
	}
}
