// Package prefixcache is the router's map of what each engine holds in its
// prefix cache: an index from a block of prompt tokens to the replicas that
// have it cached, keyed by the router's own chained hash over token ids, and
// the pieces that feed it: a per-replica Tracker that turns an engine's KV
// events (package kvevents) into index entries, placements recorded by the
// router itself where a pool has no events, and the tokenizer and chat
// rendering that give a request its blocks.
//
// The router never reproduces an engine's block hash (vLLM seeds it
// randomly per process unless told otherwise, and its input changes between
// versions): events carry the blocks' token ids, so both sides key a block
// by Keys over the same tokens.
package prefixcache

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// RootSeed is the parent key of every sequence's first block when no
// namespace applies.
const RootSeed uint64 = 0x6770_7572_6f75_7465 // "gpuroute"

// NamespaceSeed is the root of the block chain of requests whose cached
// blocks are kept apart by the engine: a LoRA adapter's (by name). An
// empty name is RootSeed.
func NamespaceSeed(name string) uint64 {
	if name == "" {
		return RootSeed
	}
	return xxhash.Sum64String("lora:"+name) | 1
}

// maxChunk is how many tokens Keys hashes per write: a stack buffer of
// 4·maxChunk bytes keeps the hot path free of allocation for any block size.
const maxChunk = 256

// AppendKeys appends one key per full block of tokens to dst and returns
// it: key_i = xxhash64(key_{i−1} ‖ tokens of block i as little-endian
// uint32), key_{−1} = seed. A block's key thus names its content and
// everything before it, as an engine's block hash does. Tokens past the
// last full block have no key (engines cache only full blocks). It
// allocates only when dst must grow; blockSize ≤ 0 appends nothing.
func AppendKeys(dst []uint64, seed uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	parent := seed
	for len(tokens) >= blockSize {
		parent = blockKey(parent, tokens[:blockSize])
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst
}

// blockKey is the key of one block of tokens after parent.
func blockKey(parent uint64, block []uint32) uint64 {
	var buf [8 + 4*maxChunk]byte
	binary.LittleEndian.PutUint64(buf[:8], parent)
	if len(block) <= maxChunk {
		n := 8
		for _, t := range block {
			binary.LittleEndian.PutUint32(buf[n:], t)
			n += 4
		}
		return xxhash.Sum64(buf[:n])
	}
	d := xxhash.New()
	_, _ = d.Write(buf[:8])
	for len(block) > 0 {
		c := block[:min(len(block), maxChunk)]
		for i, t := range c {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		_, _ = d.Write(buf[:4*len(c)])
		block = block[len(c):]
	}
	return d.Sum64()
}
