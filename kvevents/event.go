// Package kvevents reads the KV-cache events a vLLM engine publishes when
// started with --kv-events-config (vllm/distributed/kv_events.py): which
// blocks of its prefix cache it stored, evicted or cleared. It decodes the
// wire format of every vLLM version that has one (events as positional
// arrays up to 0.23, as maps tagged with "type" from 0.24), subscribes to
// one replica's ZMQ PUB socket with gap detection and replay (Subscriber),
// and publishes the same stream for the simulator (Publisher), so the
// router's prefix index can know what each engine holds instead of guessing.
//
// Wiring, per pool (a proposal for the router's configuration):
//
//	kv_events:
//	  endpoint: "tcp://{host}:5557"        # ExpandEndpoint fills {host} from each replica's URL
//	  replay_endpoint: "tcp://{host}:5558" # "" = no replay: every gap drops the replica's entries
//	  topic: ""                            # subscription prefix
//	  data_parallel_size: 1                # rank r publishes on port+r (OffsetPort)
//
// and per replica: a prefixcache.Tracker on the pool's prefixcache.Index as
// the Sink of a Subscriber, whose Run(ctx) lives as long as the replica is
// in the pool (discovery included).
package kvevents

import "errors"

// Errors. Check them with errors.Is.
var (
	// ErrMalformed means a message or payload is not a KV event batch in
	// any encoding vLLM has used.
	ErrMalformed = errors.New("kvevents: malformed event batch")
	// ErrClosed means the Publisher was closed.
	ErrClosed = errors.New("kvevents: publisher closed")
	// ErrEndpoint means an endpoint or endpoint template is unusable.
	ErrEndpoint = errors.New("kvevents: bad endpoint")
)

// Kind is an event's type, vLLM's msgspec tag.
type Kind uint8

// The event kinds. KindUnknown is an event of a type this package does not
// know (a newer vLLM's): decoded, skipped, never an error, so one new event
// type does not blind the router to the others.
const (
	KindUnknown Kind = iota
	KindBlockStored
	KindBlockRemoved
	KindAllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case KindBlockStored:
		return "BlockStored"
	case KindBlockRemoved:
		return "BlockRemoved"
	case KindAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// OptInt is an optional integer: msgspec's `int | None`. The zero value is
// None.
type OptInt struct {
	V   int64
	Set bool
}

// Some returns a set OptInt.
func Some(v int64) OptInt { return OptInt{V: v, Set: true} }

// OptString is an optional string: msgspec's `str | None`. The zero value
// is None.
type OptString struct {
	V   string
	Set bool
}

// SomeString returns a set OptString.
func SomeString(s string) OptString { return OptString{V: s, Set: true} }

// MediumGPU is the medium of blocks in the engine's GPU KV cache (vLLM's
// MEDIUM_GPU). Events before vLLM 0.10 have no medium: read None as GPU.
const MediumGPU = "GPU"

// Event is one KV-cache event with the fields of vLLM's BlockStored,
// BlockRemoved and AllBlocksCleared (only Kind for the last).
//
// Block hashes are the engine's own, as 64-bit keys: vLLM sends them as
// unsigned ints (the low 64 bits of its sha256 digest, the default), as
// signed ints (Python's hash(), before 0.10) or, with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, as the digest's bytes; bytes are
// read as vLLM's int conversion reads them (their last 8 bytes, big-endian),
// so one block has one key whichever way it travelled. The router never
// needs to reproduce the engine's hash function: TokenIDs carry the
// content.
type Event struct {
	Kind Kind
	// BlockHashes are the blocks stored or removed, parent first.
	BlockHashes []uint64
	// ParentHash is the block before the first stored one (HasParent false:
	// the first block of a sequence). BlockStored only.
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the stored blocks' tokens, BlockSize per block, in
	// order. BlockStored only.
	TokenIDs  []uint32
	BlockSize int
	// LoraID is deprecated upstream in favour of LoraName.
	LoraID   OptInt
	Medium   OptString
	LoraName OptString
	// ExtraKeys holds, when set, one raw msgpack value per stored block:
	// the multimodal, LoRA, cache-salt keys vLLM mixed into that block's
	// hash (0xc0, nil, for a block with none). Set is false when the event
	// has no extra_keys field (before vLLM 0.17, or omitted as None).
	ExtraKeys    [][]byte
	ExtraKeysSet bool
	// GroupIdx is the KV-cache group of the blocks (hybrid models have
	// several); None before vLLM 0.20.
	GroupIdx OptInt
	// SpecKind and SlidingWindow describe the group's cache spec
	// ("full_attention", "sliding_window", …). BlockStored only.
	SpecKind      OptString
	SlidingWindow OptInt
}

// Batch is one published message's payload: vLLM's KVEventBatch.
type Batch struct {
	TS     float64 // publisher's wall clock, seconds since the epoch
	Events []Event
	// DPRank is the data-parallel rank of the engine that published it.
	DPRank OptInt
}

// reset empties b for reuse, keeping its slices' storage.
func (b *Batch) reset() {
	for i := range b.Events {
		e := &b.Events[i]
		*e = Event{BlockHashes: e.BlockHashes[:0], TokenIDs: e.TokenIDs[:0], ExtraKeys: e.ExtraKeys[:0]}
	}
	b.Events = b.Events[:0]
	b.TS, b.DPRank = 0, OptInt{}
}
