package prefixcache

import (
	"errors"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Errors. Check them with errors.Is.
var (
	// ErrFull means the index already tracks MaxReplicas replicas.
	ErrFull = errors.New("prefixcache: index full")
	// ErrNoSlot means a slot number names no replica of the index.
	ErrNoSlot = errors.New("prefixcache: no such slot")
)

// MaxReplicas is how many replicas one Index tracks: a block's holders are
// one machine word, so a lookup reads one word per block.
const MaxReplicas = 64

// numShards spreads the block map over this many locks, so that a
// subscriber applying a batch and requests looking up rarely meet.
const numShards = 64

// Index maps blocks (keys from AppendKeys) to the replicas that hold them,
// for one pool. Replicas occupy slots 0…MaxReplicas−1 (Add); each slot
// holds at most its capacity in blocks, the least recently stored or
// touched going first, so the index's memory is bounded by the engines'
// KV capacities however many events or placements arrive. Safe for
// concurrent use: Lookup takes one shard read lock per block and never
// allocates. Build with NewIndex; the zero value is unusable.
type Index struct {
	shards [numShards]shard
	live   atomic.Uint64 // bit s set: slot s is in use

	mu    sync.Mutex // guards slots' allocation (not their contents)
	slots [MaxReplicas]*slotState
}

type shard struct {
	mu sync.RWMutex
	m  map[uint64]uint64 // key → holders (bit per slot)
	_  [40]byte          // keep neighbouring shards' locks off one cache line
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	x := &Index{}
	for i := range x.shards {
		x.shards[i].m = make(map[uint64]uint64)
	}
	return x
}

func (x *Index) shard(key uint64) *shard { return &x.shards[key>>58] } // keys are hashes: top bits spread

// Add gives a replica a slot, holding at most capacity blocks (≤ 0: no
// bound until SetCapacity). name is for metrics and logs. It fails with
// ErrFull when every slot is taken.
func (x *Index) Add(name string, capacity int) (int, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for s := range x.slots {
		if x.slots[s] == nil {
			x.slots[s] = newSlotState(name, capacity)
			x.live.Or(1 << s)
			return s, nil
		}
	}
	return -1, ErrFull
}

// Remove forgets a replica and everything it held; its slot may be reused.
func (x *Index) Remove(slot int) {
	st := x.slot(slot)
	if st == nil {
		return
	}
	x.live.And(^(uint64(1) << slot))
	st.mu.Lock()
	// dead stops a Store that already found st from setting bits after
	// the clear, which a later replica in this slot would inherit.
	st.dead = true
	x.clearLocked(st, uint64(1)<<slot)
	st.mu.Unlock()
	x.mu.Lock()
	x.slots[slot] = nil
	x.mu.Unlock()
}

func (x *Index) slot(s int) *slotState {
	if s < 0 || s >= MaxReplicas {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.slots[s]
}

// Name is the name a slot was added with ("" for a free slot).
func (x *Index) Name(slot int) string {
	if st := x.slot(slot); st != nil {
		return st.name
	}
	return ""
}

// Slots returns the slots in use, in order.
func (x *Index) Slots() []int {
	var out []int
	for m := x.live.Load(); m != 0; m &= m - 1 {
		out = append(out, bits.TrailingZeros64(m))
	}
	return out
}

// Lookup writes to held[s], for every slot s < len(held), how many of keys'
// leading blocks that replica holds: its longest prefix match in blocks (0
// for a free slot). It returns the longest match of any replica. keys come
// from AppendKeys over the request's tokens, computed once per request.
// It never allocates.
func (x *Index) Lookup(keys []uint64, held []int) int {
	for i := range held {
		held[i] = 0
	}
	alive := x.live.Load()
	for i, k := range keys {
		sh := x.shard(k)
		sh.mu.RLock()
		m := sh.m[k]
		sh.mu.RUnlock()
		m &= alive
		for gone := alive &^ m; gone != 0; gone &= gone - 1 {
			if s := bits.TrailingZeros64(gone); s < len(held) {
				held[s] = i
			}
		}
		if alive = m; alive == 0 {
			return i
		}
	}
	for m := alive; m != 0; m &= m - 1 {
		if s := bits.TrailingZeros64(m); s < len(held) {
			held[s] = len(keys)
		}
	}
	return len(keys)
}

// Store records that the replica in slot holds keys (already held ones are
// touched: they become the most recent). Past its capacity the least
// recent blocks go.
func (x *Index) Store(slot int, keys []uint64) {
	st := x.slot(slot)
	if st == nil {
		return
	}
	bit := uint64(1) << slot
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.dead {
		return
	}
	for _, k := range keys {
		if !st.touch(k) {
			continue
		}
		x.set(k, bit)
		for st.cap > 0 && st.lru.len > st.cap {
			x.evictOne(st, bit)
		}
	}
}

// Evict records that the replica no longer holds keys.
func (x *Index) Evict(slot int, keys []uint64) {
	st := x.slot(slot)
	if st == nil {
		return
	}
	bit := uint64(1) << slot
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, k := range keys {
		if st.remove(k) {
			x.unset(k, bit)
		}
	}
}

// EvictOldest drops the replica's n least recent blocks: for placements
// the router recorded itself, the blocks the engine must have evicted to
// make room for work the router did not see (another router's).
func (x *Index) EvictOldest(slot, n int) {
	st := x.slot(slot)
	if st == nil {
		return
	}
	bit := uint64(1) << slot
	st.mu.Lock()
	defer st.mu.Unlock()
	for ; n > 0 && st.lru.len > 0; n-- {
		x.evictOne(st, bit)
	}
}

// Age records that the replica in slot stored n blocks the index cannot
// name: written by requests it never saw (another router's, a client
// sent straight to the engine) or without keys. In the engine they took
// n places in its cache's recency order, so here n stand-ins do: past
// the slot's capacity the least recent blocks go, as the engine evicted
// them. A stand-in is never found by Lookup and is not counted by Len.
// A slot without a capacity bound ages nothing.
func (x *Index) Age(slot, n int) {
	st := x.slot(slot)
	if st == nil || n <= 0 {
		return
	}
	bit := uint64(1) << slot
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.dead || st.cap <= 0 {
		return
	}
	for n = min(n, st.cap); n > 0; n-- {
		st.standIns.hi++
		st.lru.touch(standInTag + st.standIns.hi)
		for st.lru.len > st.cap {
			x.evictOne(st, bit)
		}
	}
}

// standInTag offsets Age's stand-in keys, numbered from 1. Real keys are
// 64-bit hashes: one falls among a slot's live stand-ins (at most its
// capacity, millions) with odds of about 2^-40.
const standInTag uint64 = 0x5bd1e9955bd1e995

// evictOne drops the slot's least recent block: a stand-in (Age) leaves
// the index's map alone.
func (x *Index) evictOne(st *slotState, bit uint64) {
	k := st.evictOldest()
	if st.standIns.holds(k) {
		st.standIns.lo++ // stand-ins are never touched again: they go in order
		return
	}
	x.unset(k, bit)
}

// Clear drops everything the replica in slot holds.
func (x *Index) Clear(slot int) {
	st := x.slot(slot)
	if st == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	x.clearLocked(st, uint64(1)<<slot)
}

func (x *Index) clearLocked(st *slotState, bit uint64) {
	for st.lru.len > 0 {
		x.evictOne(st, bit)
	}
	st.reset()
}

// SetCapacity bounds the replica to n blocks (≤ 0: unbounded), dropping
// the least recent ones past it: the engine's num_gpu_blocks, once its
// /metrics tells it.
func (x *Index) SetCapacity(slot, n int) {
	st := x.slot(slot)
	if st == nil {
		return
	}
	bit := uint64(1) << slot
	st.mu.Lock()
	defer st.mu.Unlock()
	st.cap = max(n, 0)
	for st.cap > 0 && st.lru.len > st.cap {
		x.evictOne(st, bit)
	}
}

// Len is how many blocks the replica in slot holds in the index (Age's
// stand-ins aside).
func (x *Index) Len(slot int) int {
	st := x.slot(slot)
	if st == nil {
		return 0
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.lru.len - int(st.standIns.hi-st.standIns.lo)
}

func (x *Index) set(k, bit uint64) {
	sh := x.shard(k)
	sh.mu.Lock()
	sh.m[k] |= bit
	sh.mu.Unlock()
}

func (x *Index) unset(k, bit uint64) {
	sh := x.shard(k)
	sh.mu.Lock()
	if m := sh.m[k] &^ bit; m == 0 {
		delete(sh.m, k)
	} else {
		sh.m[k] = m
	}
	sh.mu.Unlock()
}

// slotState is one replica's blocks in recency order.
type slotState struct {
	name     string
	mu       sync.Mutex // guards the fields below
	cap      int
	lru      lru
	standIns standIns
	dead     bool // removed from the index: stores are dropped
}

// standIns numbers a slot's live stand-ins (Index.Age): those in
// (lo, hi], keyed standInTag + number.
type standIns struct{ lo, hi uint64 }

func (s standIns) holds(k uint64) bool { n := k - standInTag; return n > s.lo && n <= s.hi }

func newSlotState(name string, capacity int) *slotState {
	st := &slotState{name: name, cap: max(capacity, 0)}
	st.lru.init()
	return st
}

func (st *slotState) touch(k uint64) (added bool) { return st.lru.touch(k) }
func (st *slotState) remove(k uint64) bool        { return st.lru.remove(k) }
func (st *slotState) evictOldest() uint64         { return st.lru.popOldest() }
func (st *slotState) reset()                      { st.lru.init(); st.standIns = standIns{} }
