package gpu

import "time"

// Fields says which parts of an EngineStats the replica reported; a part it
// did not report is left zero and must be read as "unknown", not as zero.
type Fields uint8

// The parts of an EngineStats, one bit each.
const (
	FieldRunning     Fields = 1 << iota // vllm:num_requests_running
	FieldWaiting                        // vllm:num_requests_waiting
	FieldKVUsage                        // vllm:kv_cache_usage_perc (or vllm:gpu_cache_usage_perc)
	FieldKVCapacity                     // vllm:cache_config_info num_gpu_blocks × block_size
	FieldPrefixCache                    // vllm:prefix_cache_{queries,hits}_total (or the gpu_ names)
	FieldPreemptions                    // vllm:num_preemptions_total
)

// Has reports whether every field in x is set in f.
func (f Fields) Has(x Fields) bool { return f&x == x }

// EngineStats is one scrape of one vLLM replica's /metrics, summed or
// averaged over its data-parallel engines (the `engine` label). It is an
// immutable snapshot once published to a Sink. The zero value means "nothing
// reported"; Reported says which fields carry data.
type EngineStats struct {
	// Running is Σ vllm:num_requests_running: requests in the batch.
	Running int
	// Waiting is Σ vllm:num_requests_waiting: requests queued in the engine.
	Waiting int
	// KVUsage is the mean over engines of the KV-cache usage, a fraction in
	// [0, 1] (vLLM ≥ 0.10 vllm:kv_cache_usage_perc, else gpu_cache_usage_perc).
	KVUsage float64
	// KVCapacityTokens is Σ num_gpu_blocks × block_size from
	// vllm:cache_config_info: how many tokens of KV the replica can hold.
	KVCapacityTokens int

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

	// Engines is how many data-parallel engines reported (the number of
	// vllm:num_requests_running series; 1 for a plain replica).
	Engines int
	// Reported says which of the fields above the replica exposed.
	Reported Fields

	// At is when the scrape completed, on the poller's clock; zero until
	// the poller publishes the snapshot.
	At time.Time
	// Latency is how long the scrape took (request to parsed result).
	Latency time.Duration
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
