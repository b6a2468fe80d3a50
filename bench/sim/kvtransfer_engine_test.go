package sim

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// kvRig is an engine with a NixlConnector and no HTTP: the scheduler's
// half of the split, stepped by hand.
func kvRig(t *testing.T, policy string) (*engine, *prometheus.Registry) {
	t.Helper()
	p := mustBuiltin(t, "qwen2.5-7b")
	d, _ := p.derive()
	reg := prometheus.NewRegistry()
	m := newEngineMetrics(reg, metricsOptions{modelName: "m", maxModelLen: d.maxModelLen, kvTransfer: true})
	e, err := newEngine(p, m)
	if err != nil {
		t.Fatal(err)
	}
	c := KVTransferConfig{Role: KVBoth, EngineID: "engine-p", LoadFailurePolicy: policy, AbortTimeout: time.Minute}
	e.kvx = newKVEngine(c.withDefaults(), 1, m.kv)
	return e, reg
}

// step runs one engine step at now and returns its end.
func step(t *testing.T, e *engine, now time.Time) time.Time {
	t.Helper()
	d := e.schedule(now)
	if d == 0 {
		t.Fatal("nothing scheduled")
	}
	e.complete(now.Add(d))
	return now.Add(d)
}

func decodeSeq(prompt, out int, sink sink) *seq {
	ids := make([]int, ceilDiv(prompt, 16))
	for i := range ids {
		ids[i] = 100 + i
	}
	return &seq{id: 1, prompt: prompt, target: out, maxTokens: out, sink: sink, salt: 7,
		kv: &seqKV{load: &kvLoad{engineID: "engine-p", requestID: "r", host: "127.0.0.1", port: 1, remote: ids}}}
}

// A decode request is admitted with blocks for its whole prompt, takes no
// token budget and no seat, counts as waiting while its KV is read, then
// computes only its prompt's last token.
func TestKVDecodeAdmissionAndLoad(t *testing.T) {
	e, reg := kvRig(t, KVLoadRecompute)
	now := time.Unix(0, 0)
	sink := &countSink{}
	s := decodeSeq(100, 5, sink)
	e.add(s, now)
	if d := e.schedule(now); d != 0 {
		t.Fatalf("a request waiting for its KV was computed (%v)", d)
	}
	pulls := e.takePulls()
	if len(pulls) != 1 || pulls[0] != s || s.state != stateRemote {
		t.Fatalf("pulls %v, state %v: want the request reading", pulls, s.state)
	}
	if got := s.kv.load.pull; len(got) != 7 || got[0] != 100 {
		t.Errorf("blocks to read %v: want the 7 remote blocks", got)
	}
	if len(s.blocks) != 7 || len(e.running) != 0 || gaugeSeries(t, reg, "vllm:num_requests_waiting")[0].value != 1 {
		t.Errorf("blocks %d, running %d: want 7 blocks held, nothing running, one waiting", len(s.blocks), len(e.running))
	}
	if e.takePulls() != nil {
		t.Error("a read was handed out twice")
	}
	e.loadDone(s, true, now)
	if d := e.schedule(now); d == 0 || len(e.batch) != 1 || e.batch[0].n != 1 {
		t.Fatalf("after the read: batch %v, want the last prompt token alone", e.batch)
	}
	e.complete(now.Add(time.Millisecond))
	if sink.tokens != 1 {
		t.Fatalf("first token not sampled: %d tokens", sink.tokens)
	}
	for sink.reason == reasonNone {
		now = step(t, e, now)
	}
	if sink.tokens != 5 || sink.reason != reasonLength || e.kv.usage() != 0 {
		t.Errorf("%d tokens, %v, usage %v: want 5, length, all freed", sink.tokens, sink.reason, e.kv.usage())
	}
}

// A failed read is recomputed (the whole prompt, locally) or fails the
// request, as kv_load_failure_policy says.
func TestKVDecodeLoadFailure(t *testing.T) {
	for _, policy := range []string{KVLoadRecompute, KVLoadFail} {
		t.Run(policy, func(t *testing.T) {
			e, reg := kvRig(t, policy)
			now := time.Unix(0, 0)
			sink := &countSink{}
			s := decodeSeq(100, 3, sink)
			e.add(s, now)
			e.schedule(now)
			e.takePulls()
			e.loadDone(s, false, now)
			if policy == KVLoadFail {
				if sink.reason != reasonError || e.kv.usage() != 0 || e.idle() != true {
					t.Errorf("reason %v, usage %v: want error, blocks freed", sink.reason, e.kv.usage())
				}
				if n := counterOf(t, reg, "vllm:request_success_total", "finished_reason", "error"); n != 1 {
					t.Errorf("finished_reason=error counted %v times", n)
				}
				return
			}
			if d := e.schedule(now); d == 0 || e.batch[0].n != 100 {
				t.Fatalf("batch %v: want the whole prompt recomputed", e.batch)
			}
			e.complete(now.Add(time.Millisecond))
			for sink.reason == reasonNone {
				now = step(t, e, now)
			}
			if sink.tokens != 3 || counterOf(t, reg, "gpurouter_sim_kv_transfer_recomputed_total", "", "") != 1 {
				t.Errorf("%d tokens, recomputed %v", sink.tokens, counterOf(t, reg, "gpurouter_sim_kv_transfer_recomputed_total", "", ""))
			}
		})
	}
}

// A prefill request's blocks are held when it finishes with length, until
// a read delivers them or the abort timeout passes; a read names the right
// engine and blocks.
func TestKVPrefillHold(t *testing.T) {
	e, reg := kvRig(t, "")
	now := time.Unix(0, 0)
	prefill := func(id string) *seq {
		s := &seq{id: 2, prompt: 100, target: 1, maxTokens: 1, sink: &countSink{}, kv: &seqKV{produce: true, reqID: id}}
		e.add(s, now)
		now = step(t, e, now)
		return s
	}
	s := prefill("a")
	out := s.kv.out
	if out == nil || len(out.RemoteBlockIDs) != 7 || out.RemoteRequestID != "a" || out.RemoteEngineID != "engine-p" || !out.DoRemotePrefill {
		t.Fatalf("kv_transfer_params %+v", out)
	}
	if e.kv.nfree != e.kv.n-7 {
		t.Errorf("%d blocks free of %d: the 7 held ones were freed", e.kv.nfree, e.kv.n)
	}
	for _, c := range []struct {
		id, engine string
		blocks     []int
		want       error
	}{
		{"nope", "engine-p", out.RemoteBlockIDs, errKVNotHeld},
		{"a", "engine-d", out.RemoteBlockIDs, errKVEngineMismatch},
		{"a", "engine-p", []int{9999}, errKVBlockMismatch},
	} {
		if err := e.beginSend(c.id, c.engine, c.blocks); !errors.Is(err, c.want) {
			t.Errorf("beginSend(%s, %s, %v) = %v, want %v", c.id, c.engine, c.blocks, err, c.want)
		}
	}
	if err := e.beginSend("a", "engine-p", out.RemoteBlockIDs[2:]); err != nil {
		t.Fatal(err)
	}
	if n := e.expireHeld(now.Add(time.Hour)); n != 0 {
		t.Error("held blocks expired under a read in flight")
	}
	e.endSend("a", true)
	if e.kv.nfree != e.kv.n || len(e.kvx.held) != 0 {
		t.Errorf("after the read: %d free of %d, %d held", e.kv.nfree, e.kv.n, len(e.kvx.held))
	}

	prefill("b")
	if n := e.expireHeld(now.Add(59 * time.Second)); n != 0 {
		t.Error("expired before the abort timeout")
	}
	if n := e.expireHeld(now.Add(time.Minute)); n != 1 || e.kv.nfree != e.kv.n {
		t.Errorf("expired %d, %d free of %d", n, e.kv.nfree, e.kv.n)
	}
	if v := counterOf(t, reg, "vllm:nixl_num_kv_expired_reqs_total", "model_name", "m"); v != 1 {
		t.Errorf("vllm:nixl_num_kv_expired_reqs_total = %v", v)
	}

	// Ended otherwise than by its max_tokens: freed at once, null params.
	s = &seq{id: 3, prompt: 100, target: 1, maxTokens: 5, sink: &countSink{}, kv: &seqKV{produce: true, reqID: "c"}}
	e.add(s, now)
	step(t, e, now)
	if s.kv.out != nil || len(e.kvx.held) != 0 || e.kv.nfree != e.kv.n {
		t.Errorf("a request that stopped held its blocks: %+v", s.kv.out)
	}
}
