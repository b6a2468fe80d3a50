package gpu

import (
	"strconv"

	dto "github.com/prometheus/client_model/go"
)

// vLLM metric names the engine parser reads (vllm/v1/metrics/loggers.py).
// Counters are exposed with _total; the _created samples are ignored.
const (
	vllmRunning        = "vllm:num_requests_running"
	vllmWaiting        = "vllm:num_requests_waiting"
	vllmKVUsage        = "vllm:kv_cache_usage_perc"
	vllmKVUsageOld     = "vllm:gpu_cache_usage_perc" // before 0.10; removed in 0.12
	vllmCacheConfig    = "vllm:cache_config_info"
	vllmPrefixQueries  = "vllm:prefix_cache_queries_total"
	vllmPrefixHits     = "vllm:prefix_cache_hits_total"
	vllmPrefixQueryOld = "vllm:gpu_prefix_cache_queries_total" // same lifecycle as gpu_cache_usage_perc
	vllmPrefixHitsOld  = "vllm:gpu_prefix_cache_hits_total"
	vllmPreemptions    = "vllm:num_preemptions_total"
)

// isEngineFamily says whether the engine parser needs the named family.
func isEngineFamily(name []byte) bool {
	switch string(name) { // no allocation: the compiler compares in place
	case vllmRunning, vllmWaiting, vllmKVUsage, vllmKVUsageOld, vllmCacheConfig,
		vllmPrefixQueries, vllmPrefixHits, vllmPrefixQueryOld, vllmPrefixHitsOld, vllmPreemptions:
		return true
	}
	return false
}

// engineParser turns vLLM /metrics text into EngineStats, reusing its
// buffer across calls. Not safe for concurrent use.
type engineParser struct{ fp familyParser }

func newEngineParser() *engineParser {
	return &engineParser{fp: familyParser{keep: isEngineFamily}}
}

// ParseEngineMetrics reads a vLLM /metrics body (Prometheus text format) into
// EngineStats: running and waiting summed over the `engine` label, KV usage
// averaged, KV capacity summed, prefix-cache and preemption counters summed,
// PrefixCacheHitRate the lifetime ratio. At, Latency and Preemptions are left
// for the poller. It returns ErrNoEngineMetrics when the body has none of the
// running, waiting and KV usage families, ErrMalformed when a line of a
// family it reads is broken; other families are not parsed at all.
func ParseEngineMetrics(text []byte) (*EngineStats, error) {
	return newEngineParser().parse(text)
}

func (p *engineParser) parse(text []byte) (*EngineStats, error) {
	mfs, err := p.fp.parse(text)
	if err != nil {
		return nil, err
	}
	s := &EngineStats{}
	if sum, n := sumFamily(mfs[vllmRunning]); n > 0 {
		s.Running, s.Engines = countOf(sum), n
		s.Reported |= FieldRunning
	}
	if sum, n := sumFamily(mfs[vllmWaiting]); n > 0 {
		s.Waiting = countOf(sum)
		s.Reported |= FieldWaiting
	}
	kv := mfs[vllmKVUsage]
	if kv == nil {
		kv = mfs[vllmKVUsageOld]
	}
	if sum, n := sumFamily(kv); n > 0 {
		s.KVUsage = min(1, max(0, sum/float64(n)))
		s.Reported |= FieldKVUsage
		if s.Engines == 0 {
			s.Engines = n
		}
	}
	if s.Reported&(FieldRunning|FieldWaiting|FieldKVUsage) == 0 {
		return nil, ErrNoEngineMetrics
	}
	if c := kvCapacity(mfs[vllmCacheConfig]); c > 0 {
		s.KVCapacityTokens = c
		s.Reported |= FieldKVCapacity
	}
	q, h := mfs[vllmPrefixQueries], mfs[vllmPrefixHits]
	if q == nil || h == nil {
		q, h = mfs[vllmPrefixQueryOld], mfs[vllmPrefixHitsOld]
	}
	qs, qn := sumFamily(q)
	hs, hn := sumFamily(h)
	if qn > 0 && hn > 0 {
		s.PrefixCacheQueries, s.PrefixCacheHits = max(0, qs), max(0, hs)
		if s.PrefixCacheQueries > 0 {
			s.PrefixCacheHitRate = min(1, s.PrefixCacheHits/s.PrefixCacheQueries)
		}
		s.Reported |= FieldPrefixCache
	}
	if sum, n := sumFamily(mfs[vllmPreemptions]); n > 0 {
		s.PreemptionsTotal = uint64(max(0, sum))
		s.Reported |= FieldPreemptions
	}
	return s, nil
}

// maxCount bounds the request counts read from an engine: a value past it
// (a broken or hostile exporter) saturates instead of wrapping around to a
// negative int, which would make the replica look idle.
const maxCount = 1 << 31

// countOf turns a gauge into a request count in [0, maxCount].
func countOf(v float64) int { return int(min(maxCount, max(0, v))) }

// sumFamily is the sum of the usable sample values of mf and how many there
// were (0 when mf is nil or has none).
func sumFamily(mf *dto.MetricFamily) (sum float64, n int) {
	if mf == nil {
		return 0, 0
	}
	for _, m := range mf.Metric {
		if v, ok := sampleValue(m); ok {
			sum += v
			n++
		}
	}
	return sum, n
}

// kvCapacity is Σ num_gpu_blocks × block_size over the series of
// vllm:cache_config_info (one per engine); series whose labels are missing
// or not numbers ("None" before profiling finished) count as 0.
func kvCapacity(mf *dto.MetricFamily) int {
	if mf == nil {
		return 0
	}
	total := 0
	for _, m := range mf.Metric {
		blocks, err1 := strconv.Atoi(label(m, "num_gpu_blocks"))
		size, err2 := strconv.Atoi(label(m, "block_size"))
		if err1 == nil && err2 == nil && blocks > 0 && size > 0 && blocks <= maxCount && size <= maxCount {
			total = min(total, maxCount*maxCount-blocks*size) + blocks*size // ≤ 2^62: no wrap-around
		}
	}
	return total
}
