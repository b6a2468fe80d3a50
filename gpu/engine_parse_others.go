package gpu

import dto "github.com/prometheus/client_model/go"

// SGLang metric names (sgl-project/sglang python/sglang/srt/metrics/
// collector.py, SchedulerMetricsCollector). Every scheduler process labels
// its gauges model_name, engine_type, tp_rank, pp_rank (newer: moe_ep_rank;
// with data parallelism dp_rank; extra_metric_labels on top).
const (
	sglangRunning    = "sglang:num_running_reqs"
	sglangWaiting    = "sglang:num_queue_reqs"
	sglangKVUsage    = "sglang:token_usage"          // fraction of the KV pool in use
	sglangKVCapacity = "sglang:max_total_num_tokens" // tokens the KV pool holds; 0 until set
)

// llama.cpp server names (ggml-org/llama.cpp tools/server/server-task.cpp
// server_task_result_metrics::to_metrics; before that tools/server/server.cpp
// and examples/server/server.cpp). Unlabelled; present only with --metrics.
const (
	llamacppProcessing = "llamacpp:requests_processing"
	llamacppDeferred   = "llamacpp:requests_deferred"
	// llamacppKVUsage is used cells / n_ctx; builds before PR #13660 (May
	// 2025) have it, later ones expose no KV gauge at all.
	llamacppKVUsage = "llamacpp:kv_cache_usage_ratio"
)

// Text-generation-inference names (huggingface/text-generation-inference
// router/src/server.rs describe_gauge!, set by the router's queue and
// batching loop). Unlabelled; a router that has served no request yet may
// not expose them at all.
const (
	tgiBatchSize = "tgi_batch_current_size"
	tgiQueueSize = "tgi_queue_size"
)

func isSGLangFamily(name []byte) bool {
	switch string(name) {
	case sglangRunning, sglangWaiting, sglangKVUsage, sglangKVCapacity:
		return true
	}
	return false
}

func isLlamaCppFamily(name []byte) bool {
	switch string(name) {
	case llamacppProcessing, llamacppDeferred, llamacppKVUsage:
		return true
	}
	return false
}

func isTGIFamily(name []byte) bool {
	switch string(name) {
	case tgiBatchSize, tgiQueueSize:
		return true
	}
	return false
}

// parseSGLang reads SGLang's families folded over data-parallel ranks (see
// rankFold); nil when none of running, waiting and KV usage is there.
func (p *engineParser) parseSGLang(mfs map[string]*dto.MetricFamily) *EngineStats {
	s := &EngineStats{}
	if sum, n := p.rankFold(mfs[sglangRunning]); n > 0 {
		s.Running, s.Engines = countOf(sum), n
		s.Reported |= FieldRunning
	}
	if sum, n := p.rankFold(mfs[sglangWaiting]); n > 0 {
		s.Waiting = countOf(sum)
		s.Reported |= FieldWaiting
	}
	if sum, n := p.rankFold(mfs[sglangKVUsage]); n > 0 {
		s.KVUsage = fractionOf(sum / float64(n))
		s.Reported |= FieldKVUsage
		if s.Engines == 0 {
			s.Engines = n
		}
	}
	if s.Reported == 0 {
		return nil
	}
	// The scheduler sets the gauge from 0 once its pool exists, so 0 is
	// "not yet", not a pool of no tokens.
	if sum, n := p.rankFold(mfs[sglangKVCapacity]); n > 0 && sum >= 1 {
		s.KVCapacityTokens = tokensOf(sum)
		s.Reported |= FieldKVCapacity
	}
	return s
}

// rankFold folds an SGLang family over its dp_rank label: within one rank
// the largest sample, across ranks the sum; n is how many ranks reported
// (a series without dp_rank is rank ""). Within a rank, the schedulers of
// its tensor- and pipeline-parallel ranks (--enable-metrics-for-all-
// schedulers) report copies of one batch, and any finer breakdown of a
// rank's numbers is at most their total, so the largest is the rank's own
// value; summing them would count one batch several times. The map is
// reused, so a scrape allocates only when a new rank appears.
func (p *engineParser) rankFold(mf *dto.MetricFamily) (sum float64, n int) {
	if mf == nil {
		return 0, 0
	}
	if p.ranks == nil {
		p.ranks = make(map[string]float64)
	}
	clear(p.ranks)
	for _, m := range mf.Metric {
		v, ok := sampleValue(m)
		if !ok {
			continue
		}
		r := label(m, "dp_rank")
		if old, seen := p.ranks[r]; !seen || v > old {
			p.ranks[r] = v
		}
	}
	for _, v := range p.ranks {
		sum += v
	}
	return sum, len(p.ranks)
}

// parseSingleEngine reads an engine that runs one scheduler per replica
// (llama.cpp, TGI): its gauges are unlabelled, so any series are summed.
// kv is the KV usage family, "" when the engine has none: KV usage is then
// left unreported, never 0. nil when none of the families is there.
func parseSingleEngine(mfs map[string]*dto.MetricFamily, running, waiting, kv string) *EngineStats {
	s := &EngineStats{Engines: 1}
	if sum, n := sumFamily(mfs[running]); n > 0 {
		s.Running = countOf(sum)
		s.Reported |= FieldRunning
	}
	if sum, n := sumFamily(mfs[waiting]); n > 0 {
		s.Waiting = countOf(sum)
		s.Reported |= FieldWaiting
	}
	if kv != "" {
		if sum, n := sumFamily(mfs[kv]); n > 0 {
			s.KVUsage = fractionOf(sum / float64(n))
			s.Reported |= FieldKVUsage
		}
	}
	if s.Reported == 0 {
		return nil
	}
	return s
}
