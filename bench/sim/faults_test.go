package sim

import (
	"encoding/json"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/gpu"
)

const smallChat = `{"model":"qwen","max_tokens":3,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`

func setFaults(t *testing.T, url string, f string) Faults {
	t.Helper()
	code, _, body := httpDo(t, "POST", url+"/sim/faults", f)
	if code != 200 {
		t.Fatalf("POST /sim/faults %s = %d %s", f, code, body)
	}
	var got Faults
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestFaultErrorsAndHealth(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	cases := []struct {
		name, faults      string
		inference, health int
	}{
		{"healthy", `{}`, 200, 200},
		{"error rate", `{"error_rate":1}`, 500, 200},
		{"error rate 503", `{"error_rate":1,"error_status":503}`, 503, 200},
		{"dead", `{"dead":true}`, 500, 503},
		{"dead but health lies", `{"dead":true,"health":"ok"}`, 500, 200},
		{"healthy but health lies", `{"health":"fail"}`, 200, 503},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			setFaults(t, u, c.faults)
			code, _, body := httpDo(t, "POST", u+"/v1/chat/completions", smallChat)
			if code != c.inference {
				t.Errorf("inference = %d %s, want %d", code, body, c.inference)
			}
			if code >= 500 {
				var e apiErrorBody
				if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != code || e.Error.Message == "" {
					t.Errorf("error body %s", body)
				}
			}
			if code, _, _ := httpDo(t, "GET", u+"/health", ""); code != c.health {
				t.Errorf("/health = %d, want %d", code, c.health)
			}
		})
	}
}

func TestFaultAdmin(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	got := setFaults(t, u, `{"error_rate":0.25,"stale_metrics_seconds":5,"throttle_reasons":["hw_thermal_slowdown"],"xid_errors":79}`)
	if got.ErrorRate != 0.25 || got.StaleMetricsSeconds != 5 || got.XidErrors != 79 {
		t.Errorf("POST echoed %+v", got)
	}
	code, _, body := httpDo(t, "GET", u+"/sim/faults", "")
	var read Faults
	if err := json.Unmarshal(body, &read); err != nil || code != 200 || read.ErrorRate != 0.25 {
		t.Errorf("GET /sim/faults = %d %s", code, body)
	}
	if got := f.Replicas()[0].Faults(); got.ErrorRate != 0.25 {
		t.Errorf("Faults() = %+v", got)
	}
	_, _, body = httpDo(t, "GET", u+"/v1/gpus", "")
	var rep gpu.HostReport
	if err := json.Unmarshal(body, &rep); err != nil || rep.GPUs[0].XidErrors != 79 ||
		len(rep.GPUs[0].ThrottleReasons) != 1 || rep.GPUs[0].SMClockMHz >= rep.GPUs[0].SMClockMaxMHz {
		t.Errorf("/v1/gpus under faults: %s", body)
	}
	for _, bad := range []string{`{"error_rate":2}`, `{"nope":1}`, `{"health":"maybe"}`, `{"error_status":404}`} {
		if code, _, _ := httpDo(t, "POST", u+"/sim/faults", bad); code != 400 {
			t.Errorf("POST %s = %d, want 400", bad, code)
		}
	}
	if err := f.Replicas()[0].SetFaults(Faults{ErrorRate: -1}); err == nil {
		t.Error("SetFaults accepted a negative error rate")
	}
}

func TestFaultHang(t *testing.T) {
	f := fastFleet(t, 1)
	r, u := f.Replicas()[0], f.URLs()[0]
	setFaults(t, u, `{"hang":true}`)
	s := openStream(t, u, "/v1/chat/completions", smallChat)
	_ = s.conn.SetReadDeadline(time.Now().Add(150 * time.Millisecond))
	if _, err := s.br.ReadByte(); !isTimeout(err) {
		t.Fatalf("hung request answered: %v", err)
	}
	if code, _, _ := httpDo(t, "GET", u+"/health", ""); code != 200 {
		t.Errorf("/health under hang = %d, want 200 (only inference hangs)", code)
	}
	waiting := r.waiting.len
	if waiting() != 1 {
		t.Fatalf("%d hung requests tracked, want 1", waiting())
	}
	s.close()
	waitFor(t, 2*time.Second, "hung request released", func() bool { return waiting() == 0 })

	setFaults(t, u, `{"hang_all":true}`)
	h := openStream(t, u, "/health", "")
	defer h.close()
	_ = h.conn.SetReadDeadline(time.Now().Add(150 * time.Millisecond))
	if _, err := h.br.ReadByte(); !isTimeout(err) {
		t.Errorf("/health answered under hang_all: %v", err)
	}
	setFaults(t, u, `{}`)
	if code, _, _ := httpDo(t, "POST", u+"/v1/chat/completions", smallChat); code != 200 {
		t.Errorf("after clearing: %d", code)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestFaultCrash(t *testing.T) {
	f := fastFleet(t, 1)
	r, u := f.Replicas()[0], f.URLs()[0]
	s := openStream(t, u, "/v1/completions", `{"model":"qwen","stream":true,"prompt":"x","max_tokens":20000,"ignore_eos":true}`)
	defer s.close()
	s.readHeader(t)
	for range 3 {
		if s.next(t) == "" {
			t.Fatal("stream ended early")
		}
	}
	setFaults(t, u, `{"crash_seconds":0.3}`)
	// The stream is cut: no [DONE], the body ends in an error or EOF.
	for {
		data := s.next(t)
		if data == "[DONE]" {
			t.Fatal("crashed stream finished cleanly")
		}
		if data == "" {
			break
		}
	}
	if st := r.State(); st.Running != 0 || st.UsedBlocks != 0 {
		t.Errorf("engine after crash: %+v", st)
	}
	addr := strings.TrimPrefix(u, "http://")
	waitFor(t, time.Second, "connection refused", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return false
		}
		return errors.Is(err, syscall.ECONNREFUSED)
	})
	waitFor(t, 3*time.Second, "replica back", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if code, _, body := httpDo(t, "POST", u+"/v1/chat/completions", smallChat); code != 200 {
		t.Errorf("after restart: %d %s", code, body)
	}
}

func TestFaultStaleMetrics(t *testing.T) {
	f := fastFleet(t, 1)
	r, u := f.Replicas()[0], f.URLs()[0]
	r.expo.snapshot(time.Now().Add(-10 * time.Second)) // history: before any request
	httpDo(t, "POST", u+"/v1/chat/completions", smallChat)
	if live := scrape(t, u)["vllm:generation_tokens_total"]; live != 3 {
		t.Fatalf("live generation_tokens_total = %v, want 3", live)
	}
	setFaults(t, u, `{"stale_metrics_seconds":5}`)
	if stale := scrape(t, u)["vllm:generation_tokens_total"]; stale != 0 {
		t.Errorf("stale generation_tokens_total = %v, want 0 (as 10 s ago)", stale)
	}
}

func TestSpeedAndSlowStart(t *testing.T) {
	r, err := NewReplica(ReplicaConfig{Profile: mustBuiltin(t, "qwen2.5-7b"), Speed: 2, Estimator: testEstimator(t)})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r.warmStart.Store(now.UnixNano())
	if got := r.speedFactor(now); got != 2 {
		t.Errorf("speed %v, want 2", got)
	}
	if err := r.SetFaults(Faults{Speed: 0.5, SlowStartSeconds: 10, SlowStartFactor: 4}); err != nil {
		t.Fatal(err)
	}
	if got := r.speedFactor(time.Now()); got != 0.25 {
		t.Errorf("speed in slow start %v, want 2·0.5/4", got)
	}
	if got := r.speedFactor(time.Now().Add(11 * time.Second)); got != 1 {
		t.Errorf("speed after slow start %v, want 1", got)
	}
}
