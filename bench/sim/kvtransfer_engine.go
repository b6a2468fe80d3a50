package sim

import (
	"errors"
	"fmt"
	"time"
)

// seqKV is a request's part in a prefill/decode split.
type seqKV struct {
	// produce: the request came with do_remote_decode. When it finishes
	// with "length" (its max_tokens of 1), its blocks are held for a
	// decode replica to read instead of freed.
	produce bool
	// reqID is the remote_request_id a held request is read by.
	reqID string
	// out is the response's kv_transfer_params, set when a produce
	// request's blocks are held; nil answers null.
	out *kvTransferParamsOut
	// load is the read of the prompt's KV from a prefill replica (the
	// request came with do_remote_prefill and what a read needs); nil
	// otherwise.
	load *kvLoad
}

// loadState is where a decode request's read stands.
type loadState uint8

const (
	loadPending loadState = iota // waiting to be admitted
	loadReading                  // blocks allocated, read in flight (stateRemote)
	loadDone                     // read: only the prompt's last token is left to compute
	loadFailed                   // read failed: the prompt is computed here
)

// kvLoad is one decode request's read, from the kv_transfer_params it
// came with.
type kvLoad struct {
	engineID, requestID, host string
	port                      int
	remote                    []int // the prefill replica's blocks of the prompt, in order
	state                     loadState
	// pull are the remote blocks to read: those past the ones the decode
	// replica found in its own prefix cache (vLLM reads the tail).
	pull []int
}

// kvEngine is the engine's NixlConnector, both halves: as a prefill
// replica it holds the blocks of finished requests until they are read or
// expire; as a decode replica it parks requests while their KV is read and
// hands the reads to the driver (takePulls), which reports back
// (loadDone). Owned by the engine, under the replica's mutex.
type kvEngine struct {
	engineID     string
	host         string // remote_host and remote_port, once the side channel is bound
	port         int
	tp           int
	abortTimeout time.Duration
	recompute    bool // kv_load_failure_policy recompute
	m            *kvMetrics

	held       map[string]*heldKV // by remote_request_id
	heldBlocks int
	loading    []*seq // stateRemote, in admission order
	pulls      []*seq // reads decided since the driver last took them
}

// heldKV is a finished prefill request's blocks, kept for a read.
type heldKV struct {
	blocks  []int32
	expires time.Time
	reading int // reads in flight: it does not expire under them
}

func newKVEngine(c KVTransferConfig, tp int, m *kvMetrics) *kvEngine {
	return &kvEngine{engineID: c.EngineID, host: c.SideChannelHost, tp: max(tp, 1), abortTimeout: c.AbortTimeout,
		recompute: c.LoadFailurePolicy != KVLoadFail, m: m, held: make(map[string]*heldKV)}
}

// Errors of a read the prefill side refuses.
var (
	errKVNotHeld        = errors.New("KV blocks not held here")
	errKVEngineMismatch = errors.New("remote engine id mismatch")
	errKVBlockMismatch  = errors.New("block ids not those of the request")
)

// admitRemote admits the waiting queue's head, a decode request whose
// prompt's KV is to be read, as vLLM's scheduler does: blocks for the
// whole prompt after its local prefix-cache hits, no token budget and no
// seat (it is not running), then parked until the read ends. false: no
// room for its blocks (the queue's head blocks the rest).
func (e *engine) admitRemote(s *seq) bool {
	hits := e.cachedBlocks(s)
	e.countPrefixQuery(s, hits)
	total := ceilDiv(s.prompt, e.blockSize)
	if total-hits+e.kv.evictableHitsOf(s, hits) > e.kv.nfree {
		return false
	}
	e.waiting.popFront()
	for i := range hits {
		s.blocks = append(s.blocks, e.kv.touch(s.blockHash(i)))
	}
	s.computed, s.sealed = hits*e.blockSize, hits
	for len(s.blocks) < total {
		s.blocks = append(s.blocks, e.kv.alloc())
	}
	ld := s.kv.load
	ld.pull, ld.state = ld.remote[hits:], loadReading
	s.state = stateRemote
	e.kvx.loading = append(e.kvx.loading, s)
	e.kvx.pulls = append(e.kvx.pulls, s)
	return true
}

// takePulls hands the reads decided since the last call to the driver.
func (e *engine) takePulls() []*seq {
	if e.kvx == nil || len(e.kvx.pulls) == 0 {
		return nil
	}
	p := e.kvx.pulls
	e.kvx.pulls = nil
	return p
}

// loadDone applies the end of s's read. Read: all the prompt's KV is
// there but its last token, which the decode replica computes to sample
// from (vLLM's _update_waiting_for_remote_kv), and s waits at the queue's
// head. Failed: recomputed from scratch, or failed with finish reason
// "error" (kv_load_failure_policy). A request no longer reading (aborted,
// the engine reset) is left alone.
func (e *engine) loadDone(s *seq, ok bool, now time.Time) {
	if s.state != stateRemote {
		return
	}
	e.kvx.unpark(s)
	switch {
	case ok:
		s.computed = max(s.computed, s.prompt-1)
		s.kv.load.state = loadDone
		e.sealComputed(s)
	case e.kvx.recompute:
		e.kv.release(s.blocks)
		s.blocks = s.blocks[:0]
		s.computed, s.sealed = 0, 0
		s.kv.load.state = loadFailed
		e.kvx.m.recomputed.Inc()
	default:
		s.kv.load.state = loadFailed
		if e.lora != nil {
			e.lora.move(s.lora, -1, 0)
		}
		e.finish(s, reasonError, now)
		s.sink.emit(0, reasonError, now)
		e.gauges(now)
		e.flushEvents(now)
		return
	}
	s.state = stateWaiting
	e.waiting.pushFront(s)
	e.gauges(now)
	e.flushEvents(now)
}

// unpark removes s from the requests reading.
func (k *kvEngine) unpark(s *seq) {
	for i, x := range k.loading {
		if x == s {
			k.loading = append(k.loading[:i], k.loading[i+1:]...)
			return
		}
	}
}

// hold keeps a finished prefill request's blocks for a decode replica, as
// request_finished does for a request capped by max_tokens, and sets the
// response's kv_transfer_params. It reports whether it took the blocks.
func (k *kvEngine) hold(s *seq, reason finishReason, now time.Time) bool {
	if reason != reasonLength || len(s.blocks) == 0 {
		return false // vLLM frees at once and answers null
	}
	k.held[s.kv.reqID] = &heldKV{blocks: s.blocks, expires: now.Add(k.abortTimeout)}
	k.heldBlocks += len(s.blocks)
	ids := make([]int, len(s.blocks))
	for i, b := range s.blocks {
		ids[i] = int(b)
	}
	s.kv.out = &kvTransferParamsOut{DoRemotePrefill: true, RemoteBlockIDs: ids, RemoteEngineID: k.engineID,
		RemoteRequestID: s.kv.reqID, RemoteHost: k.host, RemotePort: k.port, TPSize: k.tp}
	k.gauges()
	return true
}

func (k *kvEngine) gauges() {
	k.m.held.Set(float64(len(k.held)))
	k.m.heldBlocks.Set(float64(k.heldBlocks))
}

// beginSend checks a read of blocks of request id, from a decode replica
// that expects engine engineID, and marks it in flight.
func (e *engine) beginSend(id, engineID string, blocks []int) error {
	h := e.kvx.held[id]
	switch {
	case h == nil:
		return fmt.Errorf("%w: request %q (expired, read already, or never prefilled here)", errKVNotHeld, id)
	case engineID != e.kvx.engineID:
		return fmt.Errorf("%w: this replica is %q, the read expects %q", errKVEngineMismatch, e.kvx.engineID, engineID)
	}
	have := make(map[int]bool, len(h.blocks))
	for _, b := range h.blocks {
		have[int(b)] = true
	}
	for _, b := range blocks {
		if !have[b] {
			return fmt.Errorf("%w: block %d of request %q", errKVBlockMismatch, b, id)
		}
	}
	h.reading++
	return nil
}

// endSend ends a read begun by beginSend: delivered, the request's blocks
// are freed (the decode replica has them: NIXL's notification); not, they
// stay held for another read or the timeout. It reports whether the
// request was still held (a crash drops everything).
func (e *engine) endSend(id string, delivered bool) bool {
	h := e.kvx.held[id]
	if h == nil {
		return false
	}
	h.reading--
	if delivered {
		e.releaseHeld(id, h)
		e.kvx.m.sent.Inc()
	}
	return true
}

func (e *engine) releaseHeld(id string, h *heldKV) {
	e.kv.release(h.blocks)
	e.kvx.heldBlocks -= len(h.blocks)
	delete(e.kvx.held, id)
	e.kvx.gauges()
	e.m.kvUsage.Set(e.kv.usage())
}

// expireHeld frees the blocks nobody read within the abort timeout and
// returns how many requests it freed.
func (e *engine) expireHeld(now time.Time) int {
	n := 0
	for id, h := range e.kvx.held {
		if h.reading == 0 && !now.Before(h.expires) {
			e.releaseHeld(id, h)
			e.kvx.m.expiredReqs.Inc()
			e.kvx.m.expired.Inc()
			n++
		}
	}
	return n
}

// resetKV drops what a crash loses: requests reading and held blocks.
func (e *engine) resetKV(now time.Time) {
	for len(e.kvx.loading) > 0 {
		e.abort(e.kvx.loading[len(e.kvx.loading)-1], now)
	}
	e.kvx.pulls = nil
	for id, h := range e.kvx.held {
		e.releaseHeld(id, h)
	}
}

// sealComputed records the full blocks of s's computed tokens in the
// prefix cache (and the KV events).
func (e *engine) sealComputed(s *seq) {
	if e.kv.cached == nil {
		return
	}
	run := 0 // blocks just cached, not yet reported
	for s.sealed < s.computed/e.blockSize {
		if e.kv.seal(s.blocks[s.sealed], s.blockHash(s.sealed)) {
			run++
		} else if run > 0 && e.events != nil {
			e.events.stored(s, s.sealed-run, run)
			run = 0
		}
		s.sealed++
	}
	if run > 0 && e.events != nil {
		e.events.stored(s, s.sealed-run, run)
	}
}
