package sim

import "time"

// finishReason is why a sequence ended, as vLLM labels request_success_total.
type finishReason uint8

const (
	reasonNone   finishReason = iota
	reasonStop                // the model stopped on its own (EOS)
	reasonLength              // max_tokens (or max_model_len) reached
	reasonAbort               // client went away, or the engine was reset
	// reasonError: the request failed in the engine (a failed KV read
	// under kv_load_failure_policy "fail"); vLLM's FINISHED_ERROR.
	reasonError
)

func (r finishReason) String() string {
	switch r {
	case reasonStop:
		return "stop"
	case reasonLength:
		return "length"
	case reasonAbort:
		return "abort"
	case reasonError:
		return "error"
	}
	return ""
}

type seqState uint8

const (
	stateNew seqState = iota
	stateWaiting
	stateRunning
	stateFinished
	// stateRemote: a decode request holding its blocks while they are read
	// from a prefill replica (vLLM's WAITING_FOR_REMOTE_KVS); it counts
	// as waiting.
	stateRemote
)

// sink receives a sequence's output. The engine calls it with its lock held,
// so implementations must not block or call back into the engine.
type sink interface {
	// emit reports n new tokens (n may be 0) and, when reason is not
	// reasonNone, that the sequence ended.
	emit(n int, reason finishReason, now time.Time)
}

// seq is one request inside the engine.
type seq struct {
	id        uint64
	prompt    int          // prompt tokens
	target    int          // output tokens this sequence will produce
	maxTokens int          // the request's cap: reaching it finishes with "length"
	hashes    []uint64     // content hashes of the full prompt blocks (prefix caching)
	ids       []uint32     // the prompt's token ids, kept only for KV events
	salt      uint64       // makes generated blocks' hashes unique to this request
	lora      *loraAdapter // the adapter the request names; nil = the base model
	kv        *seqKV       // the request's part in a prefill/decode split; nil = none
	sink      sink

	state    seqState
	output   int     // tokens generated so far
	computed int     // tokens whose KV is in the cache
	blocks   []int32 // KV blocks held, in order
	sealed   int     // leading blocks whose hash is recorded
	genHash  []uint64
	preempts int

	arrival    time.Time // request received by the frontend
	queued     time.Time // entered the waiting queue
	scheduled  time.Time // first scheduled
	firstToken time.Time
	lastToken  time.Time
}

func (s *seq) numTokens() int { return s.prompt + s.output }

// blockHash is the chained hash of block i (which must be full): the prompt's
// content hash, or for generated tokens a hash unique to this request, so
// that only the request itself hits them again (after a preemption).
func (s *seq) blockHash(i int) uint64 {
	if i < len(s.hashes) {
		return s.hashes[i]
	}
	for len(s.hashes)+len(s.genHash) <= i {
		k := len(s.hashes) + len(s.genHash)
		prev := uint64(0)
		if k > 0 {
			prev = s.blockHash(k - 1)
		}
		s.genHash = append(s.genHash, nonzero(mix64(prev^s.salt, uint64(k))))
	}
	return s.genHash[i-len(s.hashes)]
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func mix64(a, b uint64) uint64 {
	x := a ^ (b + 0x9E3779B97F4A7C15 + a<<6 + a>>2)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

func nonzero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}
