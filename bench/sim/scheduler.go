package sim

import (
	"fmt"
	"time"
)

// engine is the clock-free core of one replica: vLLM V1's scheduler over a
// block-pool KV cache. A driver calls schedule(now) to decide the next step
// and learn its duration, lets that much time pass (real or virtual), then
// calls complete(end) to apply the step's outputs. Requests may be added or
// aborted between those two calls; an abort frees the sequence's blocks at
// once and its share of the step is discarded.
//
// Scheduling follows vLLM V1 (vllm/v1/core/sched/scheduler.py): running
// sequences first, in order, each taking what it still needs (one token when
// decoding, a chunk of the budget when prefilling); when a sequence can't get
// the blocks it needs, the last running sequence is preempted (recompute:
// blocks freed, back to the front of the waiting queue). Then, unless
// something was preempted, waiting sequences are admitted FCFS while there is
// budget, a free seat under max_num_seqs and room for their blocks (after
// prefix-cache hits). The head of the queue blocks the rest (no skipping),
// except for LoRA: a request whose adapter would make the step's distinct
// adapters exceed max_loras is skipped and keeps its place (lora.go).
//
// Not safe for concurrent use: a Replica guards it with its mutex.
type engine struct {
	cost        costModel
	kv          *kvCache
	blockSize   int
	maxNumSeqs  int
	budget      int
	maxModelLen int
	chunked     bool
	m           *engineMetrics
	events      *kvEventLog // nil: KV events off
	lora        *loraEngine // nil: LoRA off
	kvx         *kvEngine   // nil: no KV connector

	waiting deque
	skipped []*seq // waiting requests skipped this step for max_loras, reused
	running []*seq
	batch   []batchEntry
	load    stepLoad

	// Totals, also in m, kept as plain numbers for reports.
	preemptions   int
	prefixQueries int
	prefixHits    int
}

type batchEntry struct {
	s *seq
	n int // tokens computed for s in this step
}

func newEngine(p Profile, m *engineMetrics) (*engine, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	d, _ := p.derive()
	e := &engine{
		cost:        newCostModel(p, d),
		kv:          newKVCache(d.numGPUBlocks, p.Engine.EnablePrefixCaching),
		blockSize:   d.blockSize,
		maxNumSeqs:  p.Engine.MaxNumSeqs,
		budget:      p.Engine.MaxNumBatchedTokens,
		maxModelLen: d.maxModelLen,
		chunked:     p.Engine.EnableChunkedPrefill,
		m:           m,
	}
	if p.Engine.EnableLoRA {
		e.lora = newLoRAEngine(d.lora, m.lora)
	}
	return e, nil
}

// check rejects a request the engine could never run, as vLLM's frontend
// does before queueing it. It reads only immutable fields: no lock needed.
func (e *engine) check(prompt, maxTokens int) error {
	if prompt+maxTokens > e.maxModelLen {
		return fmt.Errorf("This model's maximum context length is %d tokens. However, you requested %d tokens "+
			"(%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			e.maxModelLen, prompt+maxTokens, prompt, maxTokens)
	}
	return nil
}

// add queues s (FCFS). now is when the engine receives it.
func (e *engine) add(s *seq, now time.Time) {
	s.state = stateWaiting
	s.queued = now
	e.waiting.pushBack(s)
	if e.lora != nil {
		e.lora.move(s.lora, +1, 0)
	}
	e.gauges(now)
}

// idle reports whether there is nothing to schedule.
func (e *engine) idle() bool { return len(e.running) == 0 && e.waiting.len() == 0 }

// schedule decides the next step and returns its modelled duration; 0 means
// nothing to do. The decision (blocks allocated, queue moves) takes effect
// now; outputs appear at complete.
func (e *engine) schedule(now time.Time) time.Duration {
	e.batch = e.batch[:0]
	e.load = stepLoad{}
	budget := e.budget
	preempted := false
	if e.lora != nil {
		e.lora.startStep()
	}

	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		need := min(s.numTokens()-s.computed, budget)
		if need <= 0 {
			continue
		}
		if e.lora != nil && !e.lora.admits(s.lora) {
			// Running sequences left out of an earlier step for lack of
			// budget may not all fit with those admitted since: vLLM
			// asserts they do; the simulator lets them wait a step.
			continue
		}
		for !e.fits(s, need) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				s = nil
				break
			}
		}
		if s == nil {
			break
		}
		e.grow(s, need)
		e.take(s, need)
		budget -= need
	}

	for !preempted && budget > 0 && e.waiting.len() > 0 && len(e.running) < e.maxNumSeqs {
		s := e.waiting.front()
		if e.lora != nil && !e.lora.admits(s.lora) {
			e.skipped = append(e.skipped, e.waiting.popFront())
			continue
		}
		if s.kv != nil && s.kv.load != nil && s.kv.load.state == loadPending {
			if !e.admitRemote(s) {
				break
			}
			continue
		}
		if len(s.blocks) > 0 {
			// Its prompt's KV was read from a prefill replica: it holds
			// its blocks and needs the last prompt token computed.
			need := min(s.numTokens()-s.computed, budget)
			if !e.fits(s, need) {
				break
			}
			e.waiting.popFront()
			e.admit(s, need, now)
			budget -= need
			continue
		}
		hits := e.cachedBlocks(s)
		e.countPrefixQuery(s, hits)
		need := s.numTokens() - hits*e.blockSize
		if !e.chunked && need > budget {
			break
		}
		need = min(need, budget)
		newBlocks := ceilDiv(hits*e.blockSize+need, e.blockSize) - hits
		if newBlocks+e.kv.evictableHitsOf(s, hits) > e.kv.nfree {
			break
		}
		e.waiting.popFront()
		for i := range hits {
			s.blocks = append(s.blocks, e.kv.touch(s.blockHash(i)))
		}
		s.computed, s.sealed = hits*e.blockSize, hits
		e.admit(s, need, now)
		budget -= need
	}
	for i := len(e.skipped) - 1; i >= 0; i-- {
		e.waiting.pushFront(e.skipped[i]) // back at the head, in order, as vLLM's skipped queue
	}
	clear(e.skipped)
	e.skipped = e.skipped[:0]

	e.gauges(now)
	if len(e.batch) == 0 {
		if e.lora != nil {
			e.lora.idle()
		}
		return 0
	}
	e.m.iterationTokens.Observe(float64(e.load.tokens))
	d := e.cost.stepTime(e.load)
	if e.lora != nil {
		d = e.lora.stepTime(d)
	}
	return d
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// admit moves s, taken off the waiting queue, into the running batch with
// need tokens to compute this step.
func (e *engine) admit(s *seq, need int, now time.Time) {
	e.grow(s, need)
	s.state = stateRunning
	if s.scheduled.IsZero() {
		s.scheduled = now
	}
	e.running = append(e.running, s)
	if e.lora != nil {
		e.lora.move(s.lora, -1, +1)
	}
	e.take(s, need)
}

// countPrefixQuery counts a prefix-cache lookup as vLLM's metrics do
// (KVCacheManager.get_computed_blocks, PrefixCacheStats.record): in tokens,
// queries the request's whole context and hits the tokens found cached,
// every time the scheduler looks — a request at the head of the queue
// that does not fit yet is counted again at the next step — and
// vllm:prefix_cache_{queries,hits}_total leave out requests resumed after
// a preemption (vLLM counts those apart, as preempted_queries).
func (e *engine) countPrefixQuery(s *seq, hits int) {
	if e.kv.cached == nil || s.preempts > 0 {
		return
	}
	e.prefixQueries += s.numTokens()
	e.prefixHits += hits * e.blockSize
	e.m.prefixQueries.Add(float64(s.numTokens()))
	e.m.prefixHits.Add(float64(hits * e.blockSize))
}

// cachedBlocks is how many leading blocks of s are cached; never all of its
// tokens (the last one must be computed to sample from).
func (e *engine) cachedBlocks(s *seq) int {
	if e.kv.cached == nil {
		return 0
	}
	limit := (s.numTokens() - 1) / e.blockSize
	n := 0
	for n < limit {
		if _, ok := e.kv.cached[s.blockHash(n)]; !ok {
			break
		}
		n++
	}
	return n
}

// evictableHitsOf counts s's first k cached blocks that nobody references.
func (c *kvCache) evictableHitsOf(s *seq, k int) int {
	n := 0
	for i := range k {
		if c.ref[c.cached[s.blockHash(i)]] == 0 {
			n++
		}
	}
	return n
}

// fits reports whether s can get the blocks for need more tokens.
func (e *engine) fits(s *seq, need int) bool {
	return ceilDiv(s.computed+need, e.blockSize)-len(s.blocks) <= e.kv.nfree
}

// grow allocates the blocks s needs for need more tokens.
func (e *engine) grow(s *seq, need int) {
	for len(s.blocks) < ceilDiv(s.computed+need, e.blockSize) {
		s.blocks = append(s.blocks, e.kv.alloc())
	}
}

func (e *engine) take(s *seq, need int) {
	e.batch = append(e.batch, batchEntry{s: s, n: need})
	e.load.add(s.computed, need)
	if e.lora != nil {
		e.lora.use(s.lora)
	}
}

// preempt frees s's blocks and requeues it at the front (recompute).
func (e *engine) preempt(s *seq) {
	e.kv.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.computed, s.sealed = 0, 0
	s.state = stateWaiting
	s.preempts++
	e.waiting.pushFront(s)
	if e.lora != nil {
		e.lora.move(s.lora, +1, -1)
	}
	e.preemptions++
	e.m.preemptions.Inc()
}

// complete applies the step scheduled last: KV computed, one token sampled
// for every sequence whose context is now complete, finished sequences
// released. now is when the step's outputs are available.
func (e *engine) complete(now time.Time) {
	finished := false
	for _, b := range e.batch {
		s := b.s
		if s.state != stateRunning {
			continue // aborted during the step
		}
		s.computed += b.n
		e.sealComputed(s)
		if s.computed < s.numTokens() {
			continue // prefill chunk
		}
		s.output++
		// Counted before the token is emitted: a client that has read its
		// last token must find it in /metrics.
		e.m.generationTokens.Inc()
		if s.firstToken.IsZero() {
			s.firstToken = now
			e.m.ttft.Observe(now.Sub(s.arrival).Seconds())
			e.m.promptTokens.Add(float64(s.prompt))
		} else {
			e.m.itl.Observe(now.Sub(s.lastToken).Seconds())
		}
		s.lastToken = now
		reason := reasonNone
		switch {
		case s.output >= s.maxTokens || s.numTokens() >= e.maxModelLen:
			reason = reasonLength
		case s.output >= s.target:
			reason = reasonStop
		}
		if reason != reasonNone {
			if e.lora != nil {
				e.lora.move(s.lora, 0, -1)
			}
			e.finish(s, reason, now)
			finished = true
		}
		s.sink.emit(1, reason, now)
	}
	e.batch = e.batch[:0]
	if finished {
		e.compactRunning()
	}
	e.gauges(now)
	e.flushEvents(now)
}

// flushEvents publishes the KV events since the last flush.
func (e *engine) flushEvents(now time.Time) {
	if e.events != nil {
		e.events.flush(now)
	}
}

// clearCache drops every cache entry, as a restarted engine starts with
// none, and says so (AllBlocksCleared).
func (e *engine) clearCache(now time.Time) {
	e.kv.clear()
	if e.events != nil {
		e.events.cleared()
	}
	e.flushEvents(now)
}

func (e *engine) compactRunning() {
	j := 0
	for _, s := range e.running {
		if s.state == stateRunning {
			e.running[j] = s
			j++
		}
	}
	clear(e.running[j:])
	e.running = e.running[:j]
}

func (e *engine) finish(s *seq, reason finishReason, now time.Time) {
	if s.kv != nil && s.kv.produce && e.kvx != nil && e.kvx.hold(s, reason, now) {
		s.blocks = nil // held for a decode replica (kvEngine.held)
	}
	e.kv.release(s.blocks)
	s.blocks = nil
	s.state = stateFinished
	e.m.finished(s, reason, now)
}

// abort ends s now, wherever it is, and frees its blocks. It reports whether
// s was still live. The sink is told (reasonAbort).
func (e *engine) abort(s *seq, now time.Time) bool {
	switch s.state {
	case stateWaiting:
		e.waiting.remove(s)
		if e.lora != nil {
			e.lora.move(s.lora, -1, 0)
		}
	case stateRunning:
		s.state = stateFinished // complete skips it
		e.compactRunning()
		if e.lora != nil {
			e.lora.move(s.lora, 0, -1)
		}
	case stateRemote:
		e.kvx.unpark(s)
		if e.lora != nil {
			e.lora.move(s.lora, -1, 0)
		}
	default:
		return false
	}
	e.finish(s, reasonAbort, now)
	s.sink.emit(0, reasonAbort, now)
	e.gauges(now)
	e.flushEvents(now)
	return true
}

// reset aborts everything (engine crash or shutdown).
func (e *engine) reset(now time.Time) {
	for e.waiting.len() > 0 {
		e.abort(e.waiting.front(), now)
	}
	for len(e.running) > 0 {
		e.abort(e.running[len(e.running)-1], now)
	}
	if e.kvx != nil {
		e.resetKV(now)
	}
	e.batch = e.batch[:0]
}

func (e *engine) gauges(now time.Time) {
	e.m.running.Set(float64(len(e.running)))
	waiting := e.waiting.len()
	if e.kvx != nil {
		waiting += len(e.kvx.loading) // vLLM's WAITING_FOR_REMOTE_KVS are waiting
	}
	e.m.waiting.Set(float64(waiting))
	e.m.kvUsage.Set(e.kv.usage())
	if e.lora != nil {
		e.lora.publish(now)
	}
}
