package gpu

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

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
	vllmFinished       = "vllm:request_success_total"
	vllmLoRAInfo       = "vllm:lora_requests_info"
)

// isVLLMFamily says whether the vLLM parser needs the named family.
func isVLLMFamily(name []byte) bool {
	switch string(name) { // no allocation: the compiler compares in place
	case vllmRunning, vllmWaiting, vllmKVUsage, vllmKVUsageOld, vllmCacheConfig,
		vllmPrefixQueries, vllmPrefixHits, vllmPrefixQueryOld, vllmPrefixHitsOld, vllmPreemptions, vllmFinished, vllmLoRAInfo:
		return true
	}
	return false
}

// isEngineFamily says whether the parser of engine e needs the named
// family; false for EngineAuto and EngineNone, which have none.
func isEngineFamily(e Engine, name []byte) bool {
	switch e {
	case EngineVLLM:
		return isVLLMFamily(name)
	case EngineSGLang:
		return isSGLangFamily(name)
	case EngineLlamaCpp:
		return isLlamaCppFamily(name)
	case EngineTGI:
		return isTGIFamily(name)
	}
	return false
}

// engineParser turns an engine's /metrics text into EngineStats, reusing
// its buffers across calls. Not safe for concurrent use.
type engineParser struct {
	engine Engine // the configured engine; EngineAuto detects it in every parse
	found  Engine // the engine of the current parse: engine, or the first known prefix seen
	fp     familyParser
	ranks  map[string]float64 // SGLang's per-dp_rank fold, reused; nil until needed
}

// newEngineParser returns a parser of engine's metrics; EngineAuto detects
// the engine in every body. engine must not be EngineNone.
func newEngineParser(engine Engine) *engineParser {
	p := &engineParser{engine: engine}
	p.fp.keep = p.keep // bound once: the filter calls it per line without allocating
	return p
}

// keep is the family filter. In auto mode the first name with a known
// prefix decides the engine; names before it belong to no engine, and only
// the decided engine's families are kept after it, so a body that mixes
// engines is read as the first one's.
func (p *engineParser) keep(name []byte) bool {
	if p.found == EngineAuto {
		p.found = engineOf(name)
	}
	return isEngineFamily(p.found, name)
}

// ParseEngineMetrics reads an inference engine's /metrics body (Prometheus
// text format) into EngineStats, detecting the engine from the first metric
// family with a known prefix (vllm:, sglang:, llamacpp:, tgi_) and setting
// EngineStats.Engine to it. Running and waiting are summed over the
// engine's data-parallel ranks, KV usage averaged, KV capacity summed; for
// vLLM also the prefix-cache, preemption and finished-request counters, PrefixCacheHitRate
// being the lifetime ratio, and the LoRA adapters (vllm:lora_requests_info's
// newest series). At, Latency and Preemptions are left for the
// poller. It returns ErrNoEngineMetrics when the body names no known engine
// or has none of its running, waiting and KV usage families, ErrMalformed
// when a line of a family it reads is broken; other families are not
// parsed at all.
func ParseEngineMetrics(text []byte) (*EngineStats, error) {
	return newEngineParser(EngineAuto).parse(text)
}

func (p *engineParser) parse(text []byte) (*EngineStats, error) {
	p.found = p.engine
	mfs, err := p.fp.parse(text)
	if err != nil {
		return nil, err
	}
	var s *EngineStats
	switch p.found {
	case EngineVLLM:
		s = parseVLLM(mfs)
	case EngineSGLang:
		s = p.parseSGLang(mfs)
	case EngineLlamaCpp:
		s = parseSingleEngine(mfs, llamacppProcessing, llamacppDeferred, llamacppKVUsage)
	case EngineTGI:
		s = parseSingleEngine(mfs, tgiBatchSize, tgiQueueSize, "")
	default:
		return nil, fmt.Errorf("%w: no vllm:, sglang:, llamacpp: or tgi_ families", ErrNoEngineMetrics)
	}
	if s == nil {
		return nil, fmt.Errorf("%w: no %s running, waiting or KV usage family", ErrNoEngineMetrics, p.found)
	}
	s.Engine = p.found
	return s, nil
}

// parseVLLM reads vLLM's families; nil when none of running, waiting and
// KV usage is there.
func parseVLLM(mfs map[string]*dto.MetricFamily) *EngineStats {
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
		s.KVUsage = fractionOf(sum / float64(n))
		s.Reported |= FieldKVUsage
		if s.Engines == 0 {
			s.Engines = n
		}
	}
	if s.Reported&(FieldRunning|FieldWaiting|FieldKVUsage) == 0 {
		return nil
	}
	s.KVBlockSize = kvBlockSize(mfs[vllmCacheConfig])
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
	if sum, n := sumFamily(mfs[vllmFinished]); n > 0 {
		s.RequestsFinished = uint64(max(0, sum))
		s.Reported |= FieldFinished
	}
	if l, ok := LoRAInfo(mfs[vllmLoRAInfo]); ok {
		s.LoRA = l
		s.Reported |= FieldLoRA
	}
	return s
}

// LoRAInfo reads vllm:lora_requests_info's newest series (the largest
// value; of equal ones, the last): false when there is none, or when its
// max_lora is not a positive number (LoRA off). bench reads an engine's
// GPU adapter slots with it too.
func LoRAInfo(mf *dto.MetricFamily) (LoRAStats, bool) {
	if mf == nil {
		return LoRAStats{}, false
	}
	var newest *dto.Metric
	best := math.Inf(-1)
	for _, m := range mf.Metric {
		if v, ok := sampleValue(m); ok && v >= best {
			newest, best = m, v
		}
	}
	if newest == nil {
		return LoRAStats{}, false
	}
	n, err := strconv.Atoi(label(newest, "max_lora"))
	if err != nil || n <= 0 {
		return LoRAStats{}, false
	}
	sec, frac := math.Modf(best)
	return LoRAStats{Running: adapterList(label(newest, "running_lora_adapters")),
		Waiting: adapterList(label(newest, "waiting_lora_adapters")), MaxLoRAs: min(n, maxCount),
		Updated: time.Unix(int64(sec), int64(frac*1e9)).UTC()}, true
}

// adapterList splits a comma-joined adapter list ("a,b", or "a, b" as some
// write it); "" is none.
func adapterList(s string) []string {
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// maxCount bounds the request counts read from an engine: a value past it
// (a broken or hostile exporter) saturates instead of wrapping around to a
// negative int, which would make the replica look idle.
const maxCount = 1 << 31

// maxTokens bounds a KV capacity in tokens (2^62): saturating there, a sum
// over engines can never wrap an int around.
const maxTokens = maxCount * maxCount

// countOf turns a gauge into a request count in [0, maxCount].
func countOf(v float64) int { return int(min(maxCount, max(0, v))) }

// tokensOf turns a gauge into a token count in [0, maxTokens].
func tokensOf(v float64) int { return int(min(maxTokens, max(0, v))) }

// fractionOf clamps a usage gauge to [0, 1]: engines round, and a broken
// exporter must not make a replica look emptier than empty.
func fractionOf(v float64) float64 { return min(1, max(0, v)) }

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
			total = min(total, maxTokens-blocks*size) + blocks*size // ≤ 2^62: no wrap-around
		}
	}
	return total
}

// kvBlockSize is the block_size label of vllm:cache_config_info's series
// when they all carry the same number; 0 when none does or they differ.
func kvBlockSize(mf *dto.MetricFamily) int {
	if mf == nil {
		return 0
	}
	size := 0
	for _, m := range mf.Metric {
		n, err := strconv.Atoi(label(m, "block_size"))
		switch {
		case err != nil || n <= 0 || n > maxCount:
		case size == 0:
			size = n
		case n != size:
			return 0
		}
	}
	return size
}
