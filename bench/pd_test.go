package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
)

func TestParseEngineURL(t *testing.T) {
	for _, c := range []struct {
		in        string
		role      EngineRole
		url, errS string
	}{
		{"http://127.0.0.1:8001", RoleColocated, "http://127.0.0.1:8001", ""},
		{"prefill=http://127.0.0.1:8001", RolePrefill, "http://127.0.0.1:8001", ""},
		{"decode=http://h:8002/metrics", RoleDecode, "http://h:8002/metrics", ""},
		{"http://h:8002/metrics?x=1", RoleColocated, "http://h:8002/metrics?x=1", ""},
		{"middle=http://h:1", RoleColocated, "", "want prefill or decode"},
	} {
		role, u, err := ParseEngineURL(c.in)
		if role != c.role || u != c.url || (err == nil) != (c.errS == "") || (err != nil && !strings.Contains(err.Error(), c.errS)) {
			t.Errorf("ParseEngineURL(%q) = %q, %q, %v", c.in, role, u, err)
		}
	}
}

// pdSim runs one simulated replica with a NixlConnector of role.
func pdSim(t *testing.T, role sim.KVRole) string {
	t.Helper()
	prof, err := sim.Builtin("qwen2.5-7b")
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.NewFleet(sim.FleetConfig{Replicas: 1, Profiles: []sim.Profile{prof}, Speeds: []float64{10}, Seed: 1,
		ServedModelNames: []string{"m"}, KVTransfer: &sim.KVTransferConfig{Role: role}, Estimator: newEstimator(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("fleet did not stop")
		}
	})
	return f.URLs()[0]
}

func post(t *testing.T, url string, body any) []byte {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, out)
	}
	return out
}

// The engines of a split run, read by the sampler, give each role's phases
// and the KV reads between them; without roles there are none.
func TestPDPhasesFromSplitEngines(t *testing.T) {
	p, d := pdSim(t, sim.KVProducer), pdSim(t, sim.KVConsumer)
	pm, dm := MetricsURL(p), MetricsURL(d)
	ctx, cancel := context.WithCancel(context.Background())
	s := &EngineSampler{URLs: []string{pm, dm}, Clock: &cancelClock{after: 1, cancel: cancel}}
	s.Run(ctx) // the first read

	// Two requests as the router will drive them (the shapes of vLLM's
	// toy_proxy_server.py; bench/sim's golden files hold them exactly).
	for range 2 {
		var pre struct {
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		out := post(t, p+"/v1/completions", map[string]any{"model": "m", "prompt": strings.Repeat("word ", 300), "max_tokens": 1,
			"stream": false, "kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false}})
		if err := json.Unmarshal(out, &pre); err != nil || len(pre.KV) < 10 {
			t.Fatalf("prefill answer %s", out)
		}
		post(t, d+"/v1/completions", map[string]any{"model": "m", "prompt": strings.Repeat("word ", 300), "max_tokens": 8,
			"ignore_eos": true, "kv_transfer_params": pre.KV})
	}
	us := s.Finish(context.Background())
	if NewPDPhases(us, nil) != nil {
		t.Error("phases without roles")
	}
	ph := NewPDPhases(us, map[string]EngineRole{pm: RolePrefill, dm: RoleDecode})
	if ph == nil || ph.Prefill.E2E.Count != 2 || ph.Decode.E2E.Count != 2 || ph.Reads.Count != 2 || ph.Bytes.Sum <= 0 ||
		ph.Failed != 0 || ph.Decode.TPOT.Count != 2 || !(ph.Decode.Queue.Mean() >= 0) {
		t.Fatalf("phases %+v", ph)
	}
	var out bytes.Buffer
	if err := WritePDPhases(&out, ph); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Prefill/Decode Phases", "prefill (1)", "decode (1)", "KV reads (decode side):                           2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	j := ph.JSON()
	if j["kv_reads"] != 2.0 || j["prefill"].(map[string]any)["requests"] != 2.0 {
		t.Errorf("JSON %v", j)
	}
}
