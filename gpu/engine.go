package gpu

import "time"

// Fields says which parts of an EngineStats the replica reported; a part it
// did not report is left zero and must be read as "unknown", not as zero.
type Fields uint8

// The parts of an EngineStats, one bit each, with the families they come
// from. llama.cpp (since May 2025) and TGI have no KV usage gauge, and only
// vLLM and SGLang report KV capacity: their snapshots leave those bits unset.
const (
	// FieldRunning: vllm:num_requests_running, sglang:num_running_reqs,
	// llamacpp:requests_processing, tgi_batch_current_size.
	FieldRunning Fields = 1 << iota
	// FieldWaiting: vllm:num_requests_waiting, sglang:num_queue_reqs,
	// llamacpp:requests_deferred, tgi_queue_size.
	FieldWaiting
	// FieldKVUsage: vllm:kv_cache_usage_perc (or vllm:gpu_cache_usage_perc),
	// sglang:token_usage, llamacpp:kv_cache_usage_ratio (old builds).
	FieldKVUsage
	// FieldKVCapacity: vllm:cache_config_info num_gpu_blocks × block_size,
	// sglang:max_total_num_tokens.
	FieldKVCapacity
	// FieldPrefixCache: vllm:prefix_cache_{queries,hits}_total (or the gpu_ names).
	FieldPrefixCache
	// FieldPreemptions: vllm:num_preemptions_total.
	FieldPreemptions
	// FieldFinished: vllm:request_success_total.
	FieldFinished
	// FieldLoRA: vllm:lora_requests_info with max_lora > 0 (vLLM V0
	// exposes the family with max_lora="0" when LoRA is off: not a LoRA
	// report).
	FieldLoRA
)

// Has reports whether every field in x is set in f.
func (f Fields) Has(x Fields) bool { return f&x == x }

// EngineStats is one scrape of one replica's /metrics (vLLM, SGLang,
// llama.cpp or TGI), summed or averaged over its data-parallel engines
// (vLLM's `engine` label, SGLang's `dp_rank`). It is an immutable snapshot
// once published to a Sink. The zero value means "nothing reported";
// Reported says which fields carry data, and a field it does not name is
// unknown, not zero.
type EngineStats struct {
	// Engine is the engine whose metric families were read.
	Engine Engine

	// Running is how many requests are in the batch, summed over engines.
	Running int
	// Waiting is how many requests are queued in the engine, summed.
	Waiting int
	// KVUsage is the mean over engines of the KV-cache usage, a fraction in
	// [0, 1] (vLLM ≥ 0.10 vllm:kv_cache_usage_perc, else gpu_cache_usage_perc;
	// SGLang token_usage; old llama.cpp kv_cache_usage_ratio).
	KVUsage float64
	// KVCapacityTokens is how many tokens of KV the replica can hold, summed
	// over engines: vLLM's num_gpu_blocks × block_size from
	// vllm:cache_config_info, SGLang's max_total_num_tokens.
	KVCapacityTokens int
	// KVBlockSize is the engine's KV block size in tokens, vLLM's
	// block_size label of vllm:cache_config_info, when every engine of
	// the replica reports the same; 0 when none does, or they differ.
	// What a prefix index keys prompts in to match the engine's blocks.
	KVBlockSize int

	// PrefixCacheQueries and PrefixCacheHits are vLLM's cumulative counters,
	// in tokens.
	PrefixCacheQueries, PrefixCacheHits float64
	// PrefixCacheHitRate is hits/queries over the last poll interval (the
	// previous rate when no queries arrived in it, the lifetime ratio on the
	// first scrape or after a counter reset), a fraction in [0, 1].
	PrefixCacheHitRate float64
	// PreemptionsTotal is vllm:num_preemptions_total, cumulative.
	PreemptionsTotal uint64
	// Preemptions is how many preemptions happened since the previous
	// snapshot (0 on the first one): the current preemption pressure.
	Preemptions uint64
	// RequestsFinished is vllm:request_success_total summed over engines
	// and finish reasons (stop, length, abort), cumulative: with running
	// and waiting it counts every request the engine has received, so
	// two scrapes tell how many arrived between them — from every router,
	// not only this one (balancer: the peer correction).
	RequestsFinished uint64
	// LoRA is the replica's LoRA adapters as vllm:lora_requests_info's
	// newest series says; the zero value when FieldLoRA is unset.
	LoRA LoRAStats

	// Engines is how many data-parallel engines reported (vLLM's engine
	// label values, SGLang's dp_rank values; 1 for a plain replica and for
	// llama.cpp and TGI).
	Engines int
	// Reported says which of the fields above the replica exposed.
	Reported Fields

	// At is when the scrape completed, on the poller's clock; zero until
	// the poller publishes the snapshot.
	At time.Time
	// Latency is how long the scrape took (request to parsed result).
	Latency time.Duration
}

// LoRAStats is what a vLLM replica serving LoRA adapters reports in
// vllm:lora_requests_info. That gauge's labels carry the state and its
// value is the wall-clock time (Unix seconds) it was last set: the engine
// sets the series of the current label set at every step and never
// removes the others, so the series with the largest value is the current
// state and the rest are history. The zero value means "no LoRA report".
type LoRAStats struct {
	// Running lists the adapters with requests in the batch
	// (running_lora_adapters), Waiting those with requests queued
	// (waiting_lora_adapters), in the engine's order. From vLLM 0.12 both
	// list every adapter with a request, running or waiting: read them as
	// "adapters with requests here" when they are equal. An adapter with
	// running requests is in a GPU slot; one idle since is not listed,
	// though it may still be in its slot.
	Running, Waiting []string
	// MaxLoRAs is max_lora: the most distinct adapters one batch holds
	// (and GPU slots).
	MaxLoRAs int
	// Updated is the newest series' value: when the engine last set it,
	// on the engine's clock.
	Updated time.Time
}

// Age is how old s is at now; a nil or unpublished snapshot is infinitely
// old, so callers that treat stale as saturated need no nil check.
func (s *EngineStats) Age(now time.Time) time.Duration {
	if s == nil || s.At.IsZero() {
		return maxDuration
	}
	return now.Sub(s.At)
}

// maxDuration is the largest time.Duration, "older than any bound".
const maxDuration = time.Duration(1<<63 - 1)

// since completes the per-interval fields of s from the previous snapshot of
// the same replica (nil for the first one).
func (s *EngineStats) since(prev *EngineStats) {
	if prev == nil {
		return
	}
	if s.Reported.Has(FieldPreemptions) && prev.Reported.Has(FieldPreemptions) &&
		s.PreemptionsTotal >= prev.PreemptionsTotal {
		s.Preemptions = s.PreemptionsTotal - prev.PreemptionsTotal
	}
	if s.Reported.Has(FieldPrefixCache) && prev.Reported.Has(FieldPrefixCache) {
		dq := s.PrefixCacheQueries - prev.PrefixCacheQueries
		dh := s.PrefixCacheHits - prev.PrefixCacheHits
		switch {
		case dq < 0 || dh < 0: // counters reset (engine restarted): keep the lifetime ratio
		case dq == 0:
			s.PrefixCacheHitRate = prev.PrefixCacheHitRate
		default:
			s.PrefixCacheHitRate = min(1, dh/dq)
		}
	}
}
