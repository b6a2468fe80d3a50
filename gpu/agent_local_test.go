package gpu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// The `gpurouter agent` path on a machine without a GPU: the real go-nvml
// library finds no libnvidia-ml.so.1 (or, built without cgo, its stand-in
// says the same), the agent still starts and answers,
// with an empty list, and says why in exactly one log line.
func TestAgentServeWithRealLibraryWithoutDriver(t *testing.T) {
	t.Parallel()
	log, logs := observedLogger(zapcore.DebugLevel)
	n := NewLocalNVML(log)
	defer n.Close()
	if err := n.Open(); !errors.Is(err, ErrGPUOff) {
		t.Skipf("this machine has an NVIDIA driver (%v): the no-GPU path is covered by TestAgentWithoutGPU", err)
	}
	a, err := NewAgent(AgentConfig{Source: NewNVMLSource(n, Selector{}), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()

	code, body := httpGet(t, base+"/v1/gpus")
	var rep HostReport
	if err := json.Unmarshal(body, &rep); err != nil || code != http.StatusOK || rep.GPUs == nil || len(rep.GPUs) != 0 || rep.Host == "" {
		t.Errorf("GET /v1/gpus: %d %s (%v)", code, body, err)
	}
	if code, body := httpGet(t, base+"/metrics"); code != http.StatusOK ||
		!bytes.Contains(body, []byte("gpurouter_gpu_telemetry_enabled 0")) {
		t.Errorf("GET /metrics: %d\n%s", code, body)
	}
	if code, _ := httpGet(t, base+"/health"); code != http.StatusOK {
		t.Errorf("GET /health: %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if logs.Len() != 1 || logs.All()[0].Message != "GPU telemetry off: libnvidia-ml.so.1 not found" {
		t.Errorf("want exactly the one off line, got %v", logs.All())
	}
}

func observedLogger(level zapcore.Level) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(level)
	return zap.New(core), logs
}

func httpGet(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func parseExposition(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	return mfs
}

// seriesValue is the value of the first series of name whose labels include want.
func seriesValue(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	for _, m := range mfs[name].GetMetric() {
		match := true
		for k, v := range want {
			if label(m, k) != v {
				match = false
			}
		}
		if match {
			v, ok := sampleValue(m)
			return v, ok
		}
	}
	return 0, false
}
