package kvevents

import (
	"encoding/binary"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// Decoder decodes batches, reusing its reader between them: the msgpack
// Decoder keeps a scratch buffer for numbers, so decoding into a used
// Batch allocates nothing. The zero value is ready to use; a Decoder is
// not safe for concurrent use (a subscriber owns one).
type Decoder struct {
	r reader
}

func (d *Decoder) reader(payload []byte) *reader {
	r := &d.r
	if r.dec == nil {
		r.dec = msgpack.NewDecoder(&r.br)
	}
	r.br.Reset(payload)
	r.payload, r.err, r.depth = payload, nil, 0
	return r
}

// DecodeBatch decodes one msgpack payload into b, reusing b's storage
// (events, hash and token slices). It reads both of vLLM's encodings, and a
// mix of them in one batch:
//
//   - up to 0.23: the batch and every event are positional arrays,
//     [ts, [event…], dp_rank] and ["BlockStored", block_hashes,
//     parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
//     extra_keys?, group_idx?, kv_cache_spec_kind?,
//     kv_cache_spec_sliding_window?] (trailing None fields omitted);
//   - from 0.24: events are maps tagged with "type" ({"type":
//     "BlockStored", "block_hashes": …}); the batch may be a map too
//     ({"ts", "events", "data_parallel_rank"}).
//
// Unknown map keys, extra trailing array fields and unknown event types are
// skipped (forward compatibility). It returns ErrMalformed when the payload
// is not a batch; b is then partly filled and must not be used. Byte
// slices in ExtraKeys alias payload.
func DecodeBatch(payload []byte, b *Batch) error {
	var d Decoder
	return d.Decode(payload, b)
}

// Decode is DecodeBatch with d's reader, so a subscriber's steady stream of
// batches decodes without allocating.
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	b.reset()
	r := d.reader(payload)
	defer func() { r.br.Reset(nil); r.payload = nil }()
	switch r.kind() {
	case mpArray:
		n := r.arrayLen()
		if n < 2 {
			return ErrMalformed
		}
		b.TS = r.float()
		decodeEvents(r, b)
		if n >= 3 {
			b.DPRank = optInt(r)
		}
		for i := 3; i < n && r.err == nil; i++ {
			r.skipValue()
		}
	case mpMap:
		sawEvents := false
		for n := r.mapLen(); n > 0 && r.err == nil; n-- {
			switch string(r.str()) {
			case "ts":
				b.TS = r.float()
			case "events":
				decodeEvents(r, b)
				sawEvents = true
			case "data_parallel_rank":
				b.DPRank = optInt(r)
			default:
				r.skipValue()
			}
		}
		if !sawEvents {
			r.fail()
		}
	default:
		return ErrMalformed
	}
	if r.err == nil && r.br.Len() != 0 {
		r.fail() // trailing garbage: not one msgpack value
	}
	return r.err
}

func decodeEvents(r *reader, b *Batch) {
	n := r.arrayLen()
	for i := 0; i < n && r.err == nil; i++ {
		if len(b.Events) < cap(b.Events) {
			b.Events = b.Events[:len(b.Events)+1]
		} else {
			b.Events = append(b.Events, Event{})
		}
		decodeEvent(r, &b.Events[len(b.Events)-1])
	}
}

// Field positions after the tag in the array encoding, in the order of
// vLLM's struct definitions.
var (
	storedFields  = [...]string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = [...]string{"block_hashes", "medium", "group_idx"}
)

func kindOf(tag []byte) Kind {
	switch string(tag) {
	case "BlockStored":
		return KindBlockStored
	case "BlockRemoved":
		return KindBlockRemoved
	case "AllBlocksCleared":
		return KindAllBlocksCleared
	}
	return KindUnknown
}

func decodeEvent(r *reader, e *Event) {
	switch r.kind() {
	case mpArray:
		n := r.arrayLen()
		if n < 1 {
			r.fail()
			return
		}
		e.Kind = kindOf(r.str())
		var names []string
		switch e.Kind {
		case KindBlockStored:
			names = storedFields[:]
		case KindBlockRemoved:
			names = removedFields[:]
		}
		for i := 1; i < n && r.err == nil; i++ {
			if i-1 < len(names) {
				eventField(r, e, names[i-1])
			} else {
				r.skipValue()
			}
		}
	case mpMap:
		n := r.mapLen()
		// The tag is the first key in msgspec's output, but a map has no
		// order to rely on: fields before "type" are read by name anyway
		// and are valid for whichever kind it turns out to be.
		sawType := false
		for ; n > 0 && r.err == nil; n-- {
			key := r.str()
			if string(key) == "type" {
				e.Kind = kindOf(r.str())
				sawType = true
				continue
			}
			eventField(r, e, string(key))
		}
		if !sawType {
			r.fail()
		}
	default:
		r.fail()
	}
	if r.err == nil && e.Kind == KindBlockStored && (e.BlockSize <= 0 || len(e.TokenIDs) != e.BlockSize*len(e.BlockHashes)) {
		// The router keys blocks by their tokens: a store whose tokens don't
		// split into its blocks can't be indexed. Such an event would be a
		// publisher bug, but it must not be read as a different block.
		e.Kind = KindUnknown
	}
}

// eventField reads the value of one named field into e.
func eventField(r *reader, e *Event, name string) {
	switch name {
	case "block_hashes":
		n := r.arrayLen()
		for i := 0; i < n && r.err == nil; i++ {
			e.BlockHashes = append(e.BlockHashes, hashKey(r))
		}
	case "parent_block_hash":
		if !r.isNil() {
			e.ParentHash, e.HasParent = hashKey(r), true
		}
	case "token_ids":
		n := r.arrayLen()
		for i := 0; i < n && r.err == nil; i++ {
			e.TokenIDs = append(e.TokenIDs, uint32(r.intIn(0, math.MaxUint32)))
		}
	case "block_size":
		e.BlockSize = int(r.intIn(0, math.MaxInt32))
	case "lora_id":
		e.LoraID = optInt(r)
	case "medium":
		e.Medium = optString(r)
	case "lora_name":
		e.LoraName = optString(r)
	case "extra_keys":
		if r.isNil() {
			return
		}
		e.ExtraKeysSet = true
		n := r.arrayLen()
		for i := 0; i < n && r.err == nil; i++ {
			e.ExtraKeys = append(e.ExtraKeys, r.skip())
		}
	case "group_idx":
		e.GroupIdx = optInt(r)
	case "kv_cache_spec_kind":
		e.SpecKind = optString(r)
	case "kv_cache_spec_sliding_window":
		e.SlidingWindow = optInt(r)
	default:
		r.skipValue()
	}
}

// hashKey reads an ExternalBlockHash (int or bytes) as a 64-bit key.
func hashKey(r *reader) uint64 {
	switch r.kind() {
	case mpInt:
		v, _ := r.int()
		return v
	case mpBin, mpStr:
		p := r.str()
		if len(p) >= 8 {
			return binary.BigEndian.Uint64(p[len(p)-8:])
		}
		var v uint64
		for _, c := range p {
			v = v<<8 | uint64(c)
		}
		return v
	}
	r.fail()
	return 0
}

func optInt(r *reader) OptInt {
	if r.isNil() {
		return OptInt{}
	}
	return Some(r.intIn(math.MinInt64, math.MaxInt64))
}

func optString(r *reader) OptString {
	if r.isNil() {
		return OptString{}
	}
	if r.kind() != mpStr {
		r.fail()
		return OptString{}
	}
	p := r.str()
	if string(p) == MediumGPU {
		return SomeString(MediumGPU) // the common value, without a copy
	}
	return SomeString(string(p))
}
