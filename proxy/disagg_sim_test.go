package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
)

// pdSim runs one simulated replica with a NixlConnector of the given role
// (as one `gpurouter sim --kv-transfer-role …` process) under faults f.
func pdSim(t *testing.T, kc sim.KVTransferConfig, f sim.Faults) *sim.Fleet {
	t.Helper()
	p, err := sim.Builtin("qwen2.5-7b")
	if err != nil {
		t.Fatal(err)
	}
	return runSims(t, sim.FleetConfig{Replicas: 1, Profiles: []sim.Profile{p}, Speeds: []float64{10},
		ServedModelNames: []string{"m"}, Seed: 1, KVTransfer: &kc, Faults: f})
}

// The prefill replica dies half-way through the decode replica's read of
// its blocks: the decode replica computes the prompt itself
// (kv_load_failure_policy recompute) and the client gets its whole
// answer; the blocks are freed; the next request, its prefill replica
// down, is served colocated. Nothing hangs: every wait is bounded.
func TestSplitPrefillDiesMidTransfer(t *testing.T) {
	// ≈40 blocks at 40 MB/s: the read takes about a second, the replica
	// dies half-way and stays down 3 s.
	p := pdSim(t, sim.KVTransferConfig{Role: sim.KVProducer, BandwidthGBps: 0.04}, sim.Faults{KVTransferCrashSeconds: 3})
	d := pdSim(t, sim.KVTransferConfig{Role: sim.KVConsumer}, sim.Faults{})
	tr := startRouterWith(t, []string{p.URLs()[0], d.URLs()[0]}, withSplit(1, 1, 100))
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 70)
	body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":20,"stream":true,"stream_options":{"include_usage":true}}`, prompt)

	var tokens atomic.Int64
	for i, want := range []string{"split", "fallback"} {
		seen := streamOnce(tr.url, "/v1/chat/completions", body, &tokens)
		if seen.status != 200 || !seen.done || seen.errEvent != "" || seen.usage == nil || seen.usage.Completion != 20 {
			t.Fatalf("request %d: status %d, done %v, error %q, usage %+v: want a whole answer of 20 tokens", i, seen.status, seen.done, seen.errEvent, seen.usage)
		}
		waitFor(t, "the request's record", func() bool { return len(tr.srv.records.Since(0, 0)) == i+1 })
		if rec := tr.srv.records.Since(0, 0)[i]; rec.PDPath != want || rec.Replica != tr.reps[1].Name() {
			t.Errorf("request %d: pd_path %q on %s, want %s on %s", i, rec.PDPath, rec.Replica, want, tr.reps[1].Name())
		}
	}
	resp, err := http.Get(d.URLs()[0] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`gpurouter_sim_kv_transfer_pulls_total{outcome="reset"} 1`, "gpurouter_sim_kv_transfer_recomputed_total 1"} {
		if !strings.Contains(string(m), want) {
			t.Errorf("decode replica's metrics lack %s: the read did not fail mid-transfer", want)
		}
	}
	dr := d.Replicas()[0]
	if st := dr.State(); st.UsedBlocks != 0 {
		t.Errorf("decode replica holds %d blocks after the answers", st.UsedBlocks)
	}
	pr := p.Replicas()[0]
	waitWithin(t, 10*time.Second, "the prefill replica's blocks freed", func() bool { return pr.State().UsedBlocks == 0 })
}
