package sim

import (
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpurouter/gpurouter/prefixcache"
)

// Property tests of the engine model, in virtual time: deterministic and
// independent of the machine's speed.

func simulate(t *testing.T, p Profile, w Workload) Report {
	t.Helper()
	rep, err := Simulate(p, w)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != w.NumPrompts {
		t.Fatalf("%d of %d requests completed", rep.Completed, w.NumPrompts)
	}
	return rep
}

func TestTTFTGrowsWithQueueLength(t *testing.T) {
	p := mustBuiltin(t, "qwen2.5-7b")
	p.Engine.MaxNumSeqs = 8 // the rest queue
	var prev time.Duration
	for _, n := range []int{1, 4, 16, 64} {
		rep := simulate(t, p, Workload{NumPrompts: n, IgnoreEOS: true,
			Classes: []RequestClass{{InputLen: 512, OutputLen: 32}}})
		if rep.TTFT.Mean <= prev {
			t.Errorf("%d queued: mean TTFT %v, not above %v", n, rep.TTFT.Mean, prev)
		}
		prev = rep.TTFT.Mean
	}
}

func TestTokenTimeGrowsWithBatch(t *testing.T) {
	p := mustBuiltin(t, "qwen3.5-9b-h100")
	var prev time.Duration
	for _, n := range []int{1, 8, 32, 128, 256} {
		rep := simulate(t, p, Workload{NumPrompts: n, IgnoreEOS: true,
			Classes: []RequestClass{{InputLen: 64, OutputLen: 256}}})
		if rep.ITL.Median <= prev {
			t.Errorf("batch %d: median ITL %v, not above %v", n, rep.ITL.Median, prev)
		}
		prev = rep.ITL.Median
	}
}

// tinyKV is a profile whose KV cache holds only 1024 tokens.
func tinyKV(t *testing.T) Profile {
	p := mustBuiltin(t, "qwen2.5-7b")
	p.Engine.NumGPUBlocksOverride = 64
	p.Engine.MaxModelLen = 1024
	return p
}

func TestKVExhaustionQueuesAndPreempts(t *testing.T) {
	p := tinyKV(t)
	reg := prometheus.NewRegistry()
	m := newEngineMetrics(reg, metricsOptions{modelName: "m", maxModelLen: 1024})
	e, err := newEngine(p, m)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	var sinks []*countSink
	for i := range 8 {
		s := &countSink{}
		sinks = append(sinks, s)
		e.add(&seq{id: uint64(i), prompt: 100, target: 300, maxTokens: 300, salt: uint64(i), sink: s, arrival: now}, now)
	}
	maxWaitingWhileRunning := 0
	for steps := 0; !e.idle(); steps++ {
		if steps > 100000 {
			t.Fatal("engine does not drain")
		}
		d := e.schedule(now)
		if d <= 0 {
			t.Fatal("work left but nothing scheduled")
		}
		if len(e.running) > 0 {
			maxWaitingWhileRunning = max(maxWaitingWhileRunning, e.waiting.len())
		}
		if used := e.kv.n - e.kv.nfree; used > e.kv.n {
			t.Fatalf("%d blocks used of %d", used, e.kv.n)
		}
		now = now.Add(d)
		e.complete(now)
	}
	if maxWaitingWhileRunning == 0 {
		t.Error("KV exhaustion never left requests waiting")
	}
	if e.preemptions == 0 || counterValue(m.preemptions) != float64(e.preemptions) {
		t.Errorf("preemptions %d, metric %v", e.preemptions, counterValue(m.preemptions))
	}
	for i, s := range sinks {
		if s.tokens != 300 || s.reason != reasonLength {
			t.Errorf("request %d: %d tokens, %v (want exactly 300 despite preemption)", i, s.tokens, s.reason)
		}
	}
	if e.kv.usage() != 0 {
		t.Errorf("usage %v after drain", e.kv.usage())
	}
}

type countSink struct {
	tokens int
	reason finishReason
}

func (c *countSink) emit(n int, reason finishReason, _ time.Time) {
	c.tokens += n
	if reason != reasonNone {
		c.reason = reason
	}
}

func TestIgnoreEOSExactAndDrawnLengths(t *testing.T) {
	p := mustBuiltin(t, "tinyllama-1.1b-a10")
	exact := simulate(t, p, Workload{NumPrompts: 50, MaxConcurrency: 10, IgnoreEOS: true, Seed: 9,
		Classes: []RequestClass{{InputLen: 100, OutputLen: 77}}})
	if exact.OutputTokens != 50*77 {
		t.Errorf("ignore_eos: %d tokens, want %d", exact.OutputTokens, 50*77)
	}
	drawn := simulate(t, p, Workload{NumPrompts: 50, MaxConcurrency: 10, Seed: 9,
		Classes: []RequestClass{{InputLen: 100, OutputLen: 400}}})
	if drawn.OutputTokens >= 50*400 || drawn.OutputTokens < 50 {
		t.Errorf("drawn lengths total %d, want below the cap of %d", drawn.OutputTokens, 50*400)
	}
}

// TestNoSharingBetweenUniquePrompts: distinct prompts share no KV blocks, so
// without preemption nothing hits the prefix cache.
func TestNoSharingBetweenUniquePrompts(t *testing.T) {
	rep := simulate(t, mustBuiltin(t, "llama3-8b-h100"), Workload{NumPrompts: 300, MaxConcurrency: 256, IgnoreEOS: true,
		Classes: []RequestClass{{InputLen: 1024, OutputLen: 64, RangeRatio: 0.5}}})
	if rep.Preemptions != 0 || rep.PrefixCacheHitRate != 0 {
		t.Errorf("hit rate %v with %d preemptions, want 0", rep.PrefixCacheHitRate, rep.Preemptions)
	}
}

func TestSimulateDeterministic(t *testing.T) {
	p := mustBuiltin(t, "qwen2.5-7b")
	w := Workload{NumPrompts: 40, RequestRate: 5, Seed: 3, Classes: []RequestClass{{InputLen: 300, OutputLen: 200, RangeRatio: 0.5}}}
	a, b := simulate(t, p, w), simulate(t, p, w)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("same seed, different reports:\n%+v\n%+v", a, b)
	}
}

func TestChunkedPrefill(t *testing.T) {
	for _, c := range []struct {
		name    string
		chunked bool
		budget  int
		steps   []int // tokens per step until the first token
	}{
		{"chunked", true, 8192, []int{8192, 8192, 3616}},
		{"whole prompt", false, 32768, []int{20000}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := mustBuiltin(t, "qwen2.5-7b")
			p.Engine.EnableChunkedPrefill, p.Engine.MaxNumBatchedTokens = c.chunked, c.budget
			e, err := newEngine(p, newEngineMetrics(prometheus.NewRegistry(), metricsOptions{modelName: "m", maxModelLen: 32768}))
			if err != nil {
				t.Fatal(err)
			}
			s := &countSink{}
			now := time.Unix(0, 0)
			e.add(&seq{prompt: 20000, target: 2, maxTokens: 2, sink: s}, now)
			var got []int
			for s.tokens == 0 {
				e.schedule(now)
				got = append(got, e.load.tokens)
				e.complete(now)
			}
			if !reflect.DeepEqual(got, c.steps) {
				t.Errorf("prefill steps %v, want %v", got, c.steps)
			}
		})
	}
}

func TestPrefixCacheSharing(t *testing.T) {
	p := mustBuiltin(t, "qwen2.5-7b")
	reg := prometheus.NewRegistry()
	m := newEngineMetrics(reg, metricsOptions{modelName: "m", maxModelLen: 32768})
	e, err := newEngine(p, m)
	if err != nil {
		t.Fatal(err)
	}
	est := testEstimator(t)
	shared := est.Synthesize(1000, 1)
	bpe, err := prefixcache.NewBPE("")
	if err != nil {
		t.Fatal(err)
	}
	hash := func(text string, _ int) []uint64 {
		return prefixcache.AppendKeys(nil, 1, bpe.AppendTokens(nil, text), 16)
	}
	a := shared + est.Synthesize(100, 2)
	b := shared + est.Synthesize(100, 3)
	now := time.Unix(0, 0)
	run := func(text string) *countSink {
		s := &countSink{}
		n := est.Count(text)
		e.add(&seq{prompt: n, target: 1, maxTokens: 1, hashes: hash(text, n), sink: s, salt: uint64(n)}, now)
		for s.reason == reasonNone {
			e.schedule(now)
			e.complete(now)
		}
		return s
	}
	run(a)
	if q, h := counterValue(m.prefixQueries), counterValue(m.prefixHits); q != float64(est.Count(a)) || h != 0 {
		t.Fatalf("first request: queries %v hits %v", q, h)
	}
	run(b)
	hits := counterValue(m.prefixHits)
	if hits < 960 || hits > 1024 {
		t.Errorf("second request hit %v tokens, want the shared 1000-token prefix in whole blocks (≥960)", hits)
	}
	run(b) // identical prompt: everything but the last token's block
	if d := counterValue(m.prefixHits) - hits; d < float64(est.Count(b)-16) {
		t.Errorf("identical prompt hit %v of %d tokens", d, est.Count(b))
	}
}

func TestKVCache(t *testing.T) {
	c := newKVCache(4, true)
	a, b := c.alloc(), c.alloc()
	if c.nfree != 2 || c.usage() != 0.5 {
		t.Fatalf("nfree %d usage %v", c.nfree, c.usage())
	}
	c.seal(a, 11)
	c.seal(b, 22)
	c.release([]int32{a, b})
	if c.nfree != 4 || c.usage() != 0 {
		t.Fatalf("after release: nfree %d", c.nfree)
	}
	// Cached blocks come back by hash; a touch takes them off the free list.
	if got := c.touch(11); got != a || c.nfree != 3 || c.ref[a] != 1 {
		t.Errorf("touch: block %d nfree %d ref %d", got, c.nfree, c.ref[a])
	}
	// Allocation evicts the least recently freed cached block: b was freed
	// before a (tail first), the two never-used blocks come first.
	c.alloc()
	c.alloc()
	if _, ok := c.cached[22]; !ok {
		t.Fatal("evicted a cached block while uncached ones were free")
	}
	c.alloc()
	if _, ok := c.cached[22]; ok || c.nfree != 0 {
		t.Errorf("block 22 still cached with nfree %d", c.nfree)
	}
}

func TestProfileKnobs(t *testing.T) {
	base := mustBuiltin(t, "llama3-8b-h100")
	blocks := base.NumGPUBlocks()
	cases := []struct {
		name, knob, value string
		check             func(p Profile) bool
	}{
		{"fp8 KV doubles blocks", "--kv-cache-dtype", "fp8", func(p Profile) bool { return p.NumGPUBlocks() == 2*blocks || p.NumGPUBlocks() == 2*blocks+1 }},
		{"max-num-seqs", "max_num_seqs", "512", func(p Profile) bool { return p.Engine.MaxNumSeqs == 512 }},
		{"negative bool", "--no-enable-prefix-caching", "", func(p Profile) bool { return !p.Engine.EnablePrefixCaching }},
		{"max-model-len 4k", "max-model-len", "4k", func(p Profile) bool { return p.Engine.MaxModelLen == 4096 }},
		{"awq weights free memory", "quantization", "awq", func(p Profile) bool { return p.NumGPUBlocks() > blocks }},
		{"tp 2", "tensor-parallel-size", "2", func(p Profile) bool { return p.NumGPUBlocks() > 2*blocks }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := base
			if err := p.Set(c.knob, c.value); err != nil {
				t.Fatal(err)
			}
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			if !c.check(p) {
				t.Errorf("%s=%s: %+v, blocks %d (base %d)", c.knob, c.value, p.Engine, p.NumGPUBlocks(), blocks)
			}
		})
	}
	p := base
	if err := p.Set("max-num-seqz", "1"); err == nil {
		t.Error("unknown knob accepted")
	}
	p.Engine.Quantization = "bogus"
	if p.Validate() == nil {
		t.Error("unknown quantization accepted")
	}
}

// TestKnobsChangePredictions is the what-if use: tuning knobs moves the
// simulated numbers the way vLLM's do.
func TestKnobsChangePredictions(t *testing.T) {
	w := Workload{NumPrompts: 300, MaxConcurrency: 300, IgnoreEOS: true, Seed: 5,
		Classes: []RequestClass{{InputLen: 1024, OutputLen: 128}}}
	base := mustBuiltin(t, "llama3-8b-h100")
	more := base
	more.Engine.MaxNumSeqs = 32
	tp := base
	tp.Engine.TensorParallelSize = 2
	rb, rm, rt := simulate(t, base, w), simulate(t, more, w), simulate(t, tp, w)
	if rm.TTFT.Mean <= rb.TTFT.Mean {
		t.Errorf("max_num_seqs 32 should queue more: TTFT %v vs %v", rm.TTFT.Mean, rb.TTFT.Mean)
	}
	if rt.TPOT.Mean >= rb.TPOT.Mean {
		t.Errorf("TP=2 should decode faster: TPOT %v vs %v", rt.TPOT.Mean, rb.TPOT.Mean)
	}
}

// counterValue reads a counter (client_golang's testutil would pull in a
// module this repository doesn't carry).
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func TestWaitSet(t *testing.T) {
	var w waitSet
	qs := make([]*request, 300)
	for i := range qs {
		qs[i] = &request{}
		w.add(qs[i])
	}
	w.add(qs[0]) // twice is once
	w.remove(qs[5])
	w.remove(qs[5])
	if w.len() != 299 {
		t.Fatalf("len %d", w.len())
	}
	checked := map[*request]int{}
	for range 4 { // round-robin: every member is checked within a few sweeps
		w.sweep(100, func(q *request) bool { checked[q]++; return q == qs[7] || q == qs[200] })
	}
	if len(checked) != 299 || w.len() != 297 || qs[7].widx != 0 || qs[200].widx != 0 {
		t.Errorf("checked %d, len %d", len(checked), w.len())
	}
	for _, q := range qs {
		w.remove(q)
	}
	if w.len() != 0 {
		t.Errorf("len %d after removing all", w.len())
	}
}
