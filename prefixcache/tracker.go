package prefixcache

import (
	"sync/atomic"

	"github.com/gpurouter/gpurouter/kvevents"
)

// Tracker applies one replica's KV events to an Index: it is the
// kvevents.Sink of that replica's Subscriber. It maps each engine block
// hash to the router's key for the same tokens when the block is stored
// (the parent's key, then the block's tokens), and keeps the mapping for
// the block's removal. It counts an engine hash stored twice (vLLM can
// cache two blocks with one hash and evict them one at a time) and two
// engine hashes with one key, so the index drops a block only when the
// engine holds no copy.
//
// A block whose key the router can't compute is tracked but never
// indexed ("opaque"): one whose parent it never saw stored (it connected
// after), one with extra keys (multimodal inputs, a cache salt, a LoRA
// adapter in vLLM ≥ 0.17) that a request's tokens don't show, and every
// block after one of those. So the index may miss what the engine has,
// never claim what it lacks. Blocks on a medium other than the GPU and
// groups other than the first full-attention one are skipped (a hybrid
// model's sliding-window groups drop old blocks by design).
//
// Apply and Reset are called from one goroutine (the subscriber's). Build
// with NewTracker.
type Tracker struct {
	idx       *Index
	slot      int
	blockSize int
	// maxBlocks bounds the engine blocks tracked: past it events were
	// lost without a gap showing (it can't happen with vLLM's sequence
	// numbers, but memory must stay bounded whatever arrives).
	maxBlocks int

	blocks  map[uint64]engineBlock // engine hash → block
	keyRefs map[uint64]int32       // router key → engine blocks with it
	group   int64                  // the group indexed; -1 until one is seen
	scratch []uint64

	ignored atomic.Int64
}

type engineBlock struct {
	key    uint64
	copies int32
	opaque bool
}

// NewTracker returns the Tracker of the replica in slot of idx, whose
// engine caches blocks of blockSize tokens (vllm:cache_config_info's
// block_size; stores of another size are ignored) and holds at most
// capacity of them (num_gpu_blocks; ≤ 0: unknown, no bound on the
// tracker beyond the index's).
func NewTracker(idx *Index, slot, blockSize, capacity int) *Tracker {
	t := &Tracker{idx: idx, slot: slot, blockSize: blockSize, group: -1}
	if capacity > 0 {
		t.maxBlocks = 2*capacity + 1024
	}
	t.reset()
	return t
}

func (t *Tracker) reset() {
	t.blocks = make(map[uint64]engineBlock)
	t.keyRefs = make(map[uint64]int32)
	t.group = -1
}

// Ignored is how many events (or blocks) were skipped: another medium,
// group or block size, or a store the tracker could not bound.
func (t *Tracker) Ignored() int64 { return t.ignored.Load() }

// Blocks is how many engine blocks the tracker follows (indexed or not).
func (t *Tracker) Blocks() int { return len(t.blocks) }

// Reset drops everything known about the replica: the index can no longer
// be trusted for it (a gap in the events replay could not close, a
// reconnect to a restarted engine, AllBlocksCleared).
func (t *Tracker) Reset() {
	t.reset()
	t.idx.Clear(t.slot)
}

// Apply applies one event, in the replica's sequence order.
func (t *Tracker) Apply(e *kvevents.Event) {
	switch e.Kind {
	case kvevents.KindBlockStored:
		t.stored(e)
	case kvevents.KindBlockRemoved:
		t.removed(e)
	case kvevents.KindAllBlocksCleared:
		t.Reset()
	}
}

// relevant says whether an event is about the blocks the index mirrors.
func (t *Tracker) relevant(e *kvevents.Event) bool {
	if e.Medium.Set && e.Medium.V != kvevents.MediumGPU {
		return false
	}
	if !e.GroupIdx.Set {
		return true
	}
	if t.group < 0 && e.Kind == kvevents.KindBlockStored &&
		(!e.SpecKind.Set || e.SpecKind.V == "full_attention") {
		t.group = e.GroupIdx.V
	}
	return e.GroupIdx.V == t.group
}

func (t *Tracker) stored(e *kvevents.Event) {
	if !t.relevant(e) || (t.blockSize > 0 && e.BlockSize != t.blockSize) {
		t.ignored.Add(1)
		return
	}
	if t.maxBlocks > 0 && len(t.blocks)+len(e.BlockHashes) > t.maxBlocks {
		// More blocks than the engine can hold: removals were lost.
		t.ignored.Add(1)
		t.Reset()
	}
	parent, opaque := NamespaceSeed(e.LoraName.V), false
	if e.HasParent {
		p, ok := t.blocks[e.ParentHash]
		parent, opaque = p.key, p.opaque || !ok
	}
	fresh := t.scratch[:0]
	for i, h := range e.BlockHashes {
		if e.ExtraKeysSet && i < len(e.ExtraKeys) && !isNil(e.ExtraKeys[i]) {
			opaque = true
		}
		b, ok := t.blocks[h]
		if ok {
			b.copies++
		} else {
			b = engineBlock{copies: 1, opaque: opaque}
			if !opaque {
				b.key = blockKey(parent, e.TokenIDs[i*e.BlockSize:(i+1)*e.BlockSize])
				if t.keyRefs[b.key]++; t.keyRefs[b.key] == 1 {
					fresh = append(fresh, b.key)
				}
			}
		}
		t.blocks[h] = b
		parent, opaque = b.key, b.opaque
	}
	t.idx.Store(t.slot, fresh)
	t.scratch = fresh[:0]
}

func (t *Tracker) removed(e *kvevents.Event) {
	if !t.relevant(e) {
		t.ignored.Add(1)
		return
	}
	gone := t.scratch[:0]
	for _, h := range e.BlockHashes {
		b, ok := t.blocks[h]
		if !ok {
			continue // stored before the tracker started
		}
		if b.copies--; b.copies > 0 {
			t.blocks[h] = b
			continue
		}
		delete(t.blocks, h)
		if b.opaque {
			continue
		}
		if t.keyRefs[b.key]--; t.keyRefs[b.key] <= 0 {
			delete(t.keyRefs, b.key)
			gone = append(gone, b.key)
		}
	}
	t.idx.Evict(t.slot, gone)
	t.scratch = gone[:0]
}

// isNil reports whether a raw msgpack value is nil.
func isNil(raw []byte) bool { return len(raw) == 0 || (len(raw) == 1 && raw[0] == 0xc0) }
