package sim

import (
	"strings"
	"testing"
	"time"
)

// Every way a read fails is a real failure between two replicas, and the
// decode replica recomputes the prompt (kv_load_failure_policy
// recompute): the client gets its whole answer either way.
func TestPDReadFailures(t *testing.T) {
	cases := []struct {
		name    string
		p, d    KVTransferConfig
		pf      Faults
		before  func(t *testing.T, p *Replica) // between the prefill answer and the decode request
		outcome string
	}{
		// ≈20 blocks of qwen2.5-7b, 18 MB, at 40 MB/s: the replica dies
		// ≈0.23 s into the read.
		{name: "prefill replica dies mid-transfer", p: KVTransferConfig{Role: KVProducer, BandwidthGBps: 0.04},
			pf: Faults{KVTransferCrashSeconds: 0.5}, outcome: pullReset},
		{name: "prefill replica stalls", p: KVTransferConfig{Role: KVProducer},
			d: KVTransferConfig{PullTimeout: 300 * time.Millisecond}, pf: Faults{KVTransferStall: true}, outcome: pullTimeout},
		{name: "transfer fails", p: KVTransferConfig{Role: KVProducer}, pf: Faults{KVTransferFailRate: 1}, outcome: pullRefused},
		{name: "blocks expired", p: KVTransferConfig{Role: KVProducer, AbortTimeout: 50 * time.Millisecond}, outcome: pullRefused,
			before: func(t *testing.T, p *Replica) {
				waitFor(t, 5*time.Second, "the held blocks to expire", func() bool { return p.State().UsedBlocks == 0 })
			}},
		{name: "prefill replica down", p: KVTransferConfig{Role: KVProducer}, outcome: pullConnect,
			before: func(t *testing.T, p *Replica) {
				p.Crash(time.Minute)
				waitFor(t, 5*time.Second, "the side channel to refuse", func() bool { return dialRefused(p.KVSideChannelAddr()) })
			}},
	}
	prompt := testEstimator(t).Synthesize(300, 3)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, pURL := pdReplica(t, c.p, c.pf)
			c.d.Role = KVConsumer
			d, dURL := pdReplica(t, c.d, Faults{})
			orig := chatRequest(prompt, 20)
			raw := prefill(t, pURL, orig, "fault-1")
			if c.before != nil {
				c.before(t, p)
			}
			text, _, _ := streamText(t, dURL, "/v1/chat/completions", mustJSON(t, decodeRequest(orig, raw)))
			if n := len(strings.Fields(text)); n != 20 {
				t.Errorf("decode replica streamed %d tokens, want 20", n)
			}
			for _, m := range []struct {
				name, label, value string
			}{
				{"gpurouter_sim_kv_transfer_pulls_total", "outcome", c.outcome},
				{"vllm:nixl_num_failed_transfers_total", "model_name", "m"},
				{"gpurouter_sim_kv_transfer_recomputed_total", "", ""},
			} {
				if v := pdCounter(t, d, m.name, m.label, m.value); v != 1 {
					t.Errorf("%s{%s=%q} = %v, want 1", m.name, m.label, m.value, v)
				}
			}
			if st := d.State(); st.UsedBlocks != 0 {
				t.Errorf("decode replica holds %d blocks after the answer", st.UsedBlocks)
			}
		})
	}
}

// Under kv_load_failure_policy "fail" a failed read fails the request:
// 500 with vLLM's error document when not streamed, an error event then
// [DONE] when streamed, and finished_reason="error".
func TestPDReadFailurePolicyFail(t *testing.T) {
	_, pURL := pdReplica(t, KVTransferConfig{Role: KVProducer}, Faults{KVTransferFailRate: 1})
	d, dURL := pdReplica(t, KVTransferConfig{Role: KVConsumer, LoadFailurePolicy: KVLoadFail}, Faults{})
	orig := chatRequest("tell me about the sea", 20)

	raw := prefill(t, pURL, orig, "fail-1")
	s := openStream(t, dURL, "/v1/chat/completions", mustJSON(t, decodeRequest(orig, raw)))
	defer s.close()
	s.readHeader(t)
	if ev := s.next(t); s.status != 200 || !strings.Contains(ev, `"error":{`) || !strings.Contains(ev, "kv_load_failure_policy=fail") {
		t.Errorf("%d, first event %q: want an error event", s.status, ev)
	}
	if ev := s.next(t); ev != "[DONE]" {
		t.Errorf("after the error: %q", ev)
	}

	raw = prefill(t, pURL, orig, "fail-2")
	req := decodeRequest(orig, raw)
	req["stream"] = false
	delete(req, "stream_options")
	code, _, body := httpDo(t, "POST", dURL+"/v1/chat/completions", mustJSON(t, req))
	if code != 500 || !strings.Contains(string(body), `"type":"InternalServerError"`) {
		t.Errorf("non-streamed: %d %s", code, body)
	}
	if v := pdCounter(t, d, "vllm:request_success_total", "finished_reason", "error"); v != 2 {
		t.Errorf("finished_reason=error: %v, want 2", v)
	}
}
