package kvevents

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding is how events are laid out on the wire.
type Encoding uint8

// The encodings vLLM has used. Both keep the batch a positional array
// [ts, [event…], dp_rank], as vLLM 0.24–0.26 do.
const (
	// EncodingArray: every event a positional array whose first element is
	// its tag (msgspec array_like=True; vLLM up to 0.23).
	EncodingArray Encoding = iota
	// EncodingMap: every event a map whose "type" key holds its tag
	// (vLLM 0.24 and later, vllm-project/vllm#42892).
	EncodingMap
)

func (e Encoding) String() string {
	if e == EncodingMap {
		return "map"
	}
	return "array"
}

// ParseEncoding reads "array" or "map".
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "array", "":
		return EncodingArray, nil
	case "map":
		return EncodingMap, nil
	}
	return 0, fmt.Errorf("kvevents: encoding %q: want array or map", s)
}

// AppendBatch appends b's msgpack encoding to dst, byte for byte what
// vLLM's msgspec encoder writes for the same KVEventBatch: fields in the
// struct's order, None defaults omitted (omit_defaults=True: trailing ones
// of an array, any of a map), integers in their smallest form, the
// timestamp as float64. Hashes are written as unsigned ints, vLLM's
// default.
//
// msgpack.Encoder writes each value in the smallest form the msgpack spec
// allows, as msgspec does; writes to a bytes.Buffer go straight through,
// so raw bytes (an extra key already in msgpack) can be put between them.
func AppendBatch(dst []byte, b *Batch, enc Encoding) []byte {
	w := newWriter(dst)
	n := 2
	if b.DPRank.Set {
		n = 3
	}
	w.array(n)
	w.float(b.TS)
	w.array(len(b.Events))
	for i := range b.Events {
		appendEvent(w, &b.Events[i], enc)
	}
	if b.DPRank.Set {
		w.int(b.DPRank.V)
	}
	return w.buf.Bytes()
}

// writer is msgpack.Encoder over a bytes.Buffer. A bytes.Buffer only fails
// by running out of memory, which panics, so the encoder's errors are nil
// and dropped here.
type writer struct {
	buf *bytes.Buffer
	enc *msgpack.Encoder
}

func newWriter(dst []byte) *writer {
	buf := bytes.NewBuffer(dst)
	return &writer{buf: buf, enc: msgpack.NewEncoder(buf)}
}

func (w *writer) array(n int)     { _ = w.enc.EncodeArrayLen(n) }
func (w *writer) mapHeader(n int) { _ = w.enc.EncodeMapLen(n) }
func (w *writer) float(f float64) { _ = w.enc.EncodeFloat64(f) }
func (w *writer) int(v int64)     { _ = w.enc.EncodeInt(v) }
func (w *writer) uint(v uint64)   { _ = w.enc.EncodeUint(v) }
func (w *writer) str(s string)    { _ = w.enc.EncodeString(s) }
func (w *writer) nil()            { _ = w.enc.EncodeNil() }
func (w *writer) raw(b []byte)    { w.buf.Write(b) }

// field is one of an event's fields, for either encoding.
type field struct {
	name     string
	optional bool // has a default (None) and is omitted when unset
	set      bool
	write    func(w *writer)
}

func appendEvent(w *writer, e *Event, enc Encoding) {
	var fields []field
	hashes := func(w *writer) {
		w.array(len(e.BlockHashes))
		for _, h := range e.BlockHashes {
			w.uint(h)
		}
	}
	switch e.Kind {
	case KindBlockStored:
		fields = []field{
			{name: "block_hashes", set: true, write: hashes},
			{name: "parent_block_hash", set: true, write: func(w *writer) {
				if e.HasParent {
					w.uint(e.ParentHash)
				} else {
					w.nil()
				}
			}},
			{name: "token_ids", set: true, write: func(w *writer) {
				w.array(len(e.TokenIDs))
				for _, t := range e.TokenIDs {
					w.uint(uint64(t))
				}
			}},
			{name: "block_size", set: true, write: func(w *writer) { w.int(int64(e.BlockSize)) }},
			{name: "lora_id", set: true, write: optIntWriter(e.LoraID)},
			{name: "medium", set: true, write: optStringWriter(e.Medium)},
			{name: "lora_name", set: true, write: optStringWriter(e.LoraName)},
			{name: "extra_keys", optional: true, set: e.ExtraKeysSet, write: func(w *writer) {
				w.array(len(e.ExtraKeys))
				for _, k := range e.ExtraKeys {
					if len(k) == 0 {
						w.nil()
						continue
					}
					w.raw(k)
				}
			}},
			{name: "group_idx", optional: true, set: e.GroupIdx.Set, write: optIntWriter(e.GroupIdx)},
			{name: "kv_cache_spec_kind", optional: true, set: e.SpecKind.Set, write: optStringWriter(e.SpecKind)},
			{name: "kv_cache_spec_sliding_window", optional: true, set: e.SlidingWindow.Set, write: optIntWriter(e.SlidingWindow)},
		}
	case KindBlockRemoved:
		fields = []field{
			{name: "block_hashes", set: true, write: hashes},
			{name: "medium", set: true, write: optStringWriter(e.Medium)},
			{name: "group_idx", optional: true, set: e.GroupIdx.Set, write: optIntWriter(e.GroupIdx)},
		}
	}
	if enc == EncodingMap {
		n := 1
		for _, f := range fields {
			if f.set || !f.optional {
				n++
			}
		}
		w.mapHeader(n)
		w.str("type")
		w.str(e.Kind.String())
		for _, f := range fields {
			if f.set || !f.optional {
				w.str(f.name)
				f.write(w)
			}
		}
		return
	}
	// Array: trailing unset optional fields are omitted, earlier ones
	// written as None to keep the positions.
	last := -1
	for i, f := range fields {
		if f.set || !f.optional {
			last = i
		}
	}
	w.array(2 + last)
	w.str(e.Kind.String())
	for _, f := range fields[:last+1] {
		if f.optional && !f.set {
			w.nil()
			continue
		}
		f.write(w)
	}
}

func optIntWriter(o OptInt) func(*writer) {
	return func(w *writer) {
		if o.Set {
			w.int(o.V)
		} else {
			w.nil()
		}
	}
}

func optStringWriter(o OptString) func(*writer) {
	return func(w *writer) {
		if o.Set {
			w.str(o.V)
		} else {
			w.nil()
		}
	}
}
