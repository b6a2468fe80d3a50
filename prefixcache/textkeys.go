package prefixcache

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockBytes is TextKeys' block where none is given: about the
// 16 tokens of an engine's block at four bytes a token.
const DefaultBlockBytes = 64

// TextKeys keys a prompt by its text, in blocks of a fixed number of
// bytes, chained as AppendKeys chains token blocks: the keys of an
// approximate index, fed by the router's own placements, where no
// engine's events say what it holds and so nothing needs the engine's
// tokens — a request's blocks match an earlier request's for as far as
// their texts agree, whatever the tokenizer, at a hash's cost instead of
// a tokenizer's. Feed it the rendered prompt in pieces (Write); Keys has
// one key per full block so far. Reset readies it (the zero value is not
// ready); it allocates only when the keys' slice must grow.
type TextKeys struct {
	keys   []uint64
	parent uint64
	d      xxhash.Digest
	n      int // bytes of the block in progress
	size   int
}

// Reset starts a prompt: its keys are appended to dst[:0], chained from
// seed, in blocks of blockBytes (≤ 0: DefaultBlockBytes).
func (t *TextKeys) Reset(dst []uint64, seed uint64, blockBytes int) {
	if blockBytes <= 0 {
		blockBytes = DefaultBlockBytes
	}
	t.keys, t.parent, t.n, t.size = dst[:0], seed, 0, blockBytes
	t.startBlock()
}

func (t *TextKeys) startBlock() {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], t.parent)
	t.d.Reset()
	_, _ = t.d.Write(b[:])
}

// Write adds p to the prompt's text.
func (t *TextKeys) Write(p []byte) {
	for len(p) > 0 {
		k := min(t.size-t.n, len(p))
		_, _ = t.d.Write(p[:k])
		t.n += k
		p = p[k:]
		if t.n == t.size {
			t.parent = t.d.Sum64()
			t.keys = append(t.keys, t.parent)
			t.n = 0
			t.startBlock()
		}
	}
}

// WriteString adds s to the prompt's text.
func (t *TextKeys) WriteString(s string) {
	for len(s) > 0 {
		k := min(t.size-t.n, len(s))
		_, _ = t.d.WriteString(s[:k])
		t.n += k
		s = s[k:]
		if t.n == t.size {
			t.parent = t.d.Sum64()
			t.keys = append(t.keys, t.parent)
			t.n = 0
			t.startBlock()
		}
	}
}

// Keys is one key per full block written so far (a partial last block
// has none: an engine caches only full blocks).
func (t *TextKeys) Keys() []uint64 { return t.keys }
