package sim

import (
	"bytes"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/common/expfmt"
)

// vLLM V1's histogram buckets (vllm/v1/metrics/loggers.py, buckets.py).
// Functions, not variables, so that nobody can change them under us.

func ttftBuckets() []float64 {
	return []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
		7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
}

func itlBuckets() []float64 {
	return []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
		7.5, 10.0, 20.0, 40.0, 80.0}
}

func requestLatencyBuckets() []float64 {
	return []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
		50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
}

func iterationTokenBuckets() []float64 {
	return []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
}

// stepLagBuckets resolve the simulator's own timing error around the 2 ms
// that matters for latency measurements.
func stepLagBuckets() []float64 {
	return []float64{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1}
}

// buckets125 is vLLM's build_1_2_5_buckets(max): 1, 2, 5, 10, 20, 50, … ≤ max.
func buckets125(maxValue int) []float64 {
	var b []float64
	for exp := 1; ; exp *= 10 {
		for _, m := range []int{1, 2, 5} {
			v := m * exp
			if v > maxValue {
				return b
			}
			b = append(b, float64(v))
		}
	}
}

// engineMetrics are one replica's Prometheus series under vLLM V1's names,
// types, labels (model_name, engine) and buckets, plus the simulator's own
// gpurouter_sim_* series. All children are resolved once, so the engine's
// hot path is a plain Set/Add/Observe.
type engineMetrics struct {
	running, waiting, kvUsage prometheus.Gauge

	prefixQueries, prefixHits, preemptions prometheus.Counter
	promptTokens, generationTokens         prometheus.Counter
	success                                [5]prometheus.Counter // by finishReason; nil where not exposed
	ttft, itl, tpot, e2e, queue, prefill   prometheus.Observer
	decode, inference, reqPrompt, reqGen   prometheus.Observer
	iterationTokens, maxTokensParam        prometheus.Observer
	stepLag, stepDuration                  prometheus.Observer
	steps                                  prometheus.Counter
	lora                                   *loraMetrics // nil without LoRA
	kv                                     *kvMetrics   // nil without a KV connector
}

// metricsOptions says what newEngineMetrics labels and how.
type metricsOptions struct {
	modelName   string
	maxModelLen int
	legacyKV    bool // vllm:gpu_cache_usage_perc instead of vllm:kv_cache_usage_perc
	cacheInfo   map[string]string
	maxLoRAs    int // > 0: LoRA is on, with this max_loras
	// kvTransfer: a KV connector is on (its series, and
	// finished_reason="error", which only a failed KV read produces here).
	kvTransfer bool
}

func newEngineMetrics(reg prometheus.Registerer, o metricsOptions) *engineMetrics {
	f := promauto.With(reg)
	labels := []string{"model_name", "engine"}
	lv := []string{o.modelName, "0"}
	gauge := func(name, help string) prometheus.Gauge {
		return f.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels).WithLabelValues(lv...)
	}
	counter := func(name, help string) prometheus.Counter {
		return f.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels).WithLabelValues(lv...)
	}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		return f.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels).
			WithLabelValues(lv...)
	}
	tokenBuckets := buckets125(o.maxModelLen)

	m := &engineMetrics{
		running: gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting: gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		prefixQueries: counter("vllm:prefix_cache_queries_total",
			"Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:       counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		preemptions:      counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		promptTokens:     counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generationTokens: counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		ttft:             hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets()),
		itl:              hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets()),
		tpot: hist("vllm:request_time_per_output_token_seconds",
			"Histogram of time_per_output_token_seconds per request.", itlBuckets()),
		e2e: hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
			requestLatencyBuckets()),
		queue: hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
			requestLatencyBuckets()),
		inference: hist("vllm:request_inference_time_seconds",
			"Histogram of time spent in RUNNING phase for request.", requestLatencyBuckets()),
		prefill: hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
			requestLatencyBuckets()),
		decode: hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
			requestLatencyBuckets()),
		reqPrompt:       hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokenBuckets),
		reqGen:          hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tokenBuckets),
		maxTokensParam:  hist("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokenBuckets),
		iterationTokens: hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", iterationTokenBuckets()),
	}
	if o.legacyKV {
		m.kvUsage = gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")
	} else {
		m.kvUsage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
	}
	succ := f.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of successfully processed requests."}, []string{"model_name", "engine", "finished_reason"})
	reasons := []finishReason{reasonStop, reasonLength, reasonAbort}
	if o.kvTransfer {
		reasons = append(reasons, reasonError)
	}
	for _, r := range reasons {
		m.success[r] = succ.WithLabelValues(o.modelName, "0", r.String())
	}

	// cache_config_info: vLLM's labels are the cache config itself plus
	// engine; model_name is added so every vllm:* series carries it.
	infoLabels := []string{"model_name", "engine"}
	infoValues := []string{o.modelName, "0"}
	for _, k := range sortedKeys(o.cacheInfo) {
		infoLabels = append(infoLabels, k)
		infoValues = append(infoValues, o.cacheInfo[k])
	}
	f.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig"},
		infoLabels).WithLabelValues(infoValues...).Set(1)

	m.stepLag = f.NewHistogram(prometheus.HistogramOpts{Name: "gpurouter_sim_step_lag_seconds",
		Help:    "How late the simulator's real-time loop ended each engine step (actual − intended); results measured while this is large are not trustworthy.",
		Buckets: stepLagBuckets()})
	m.stepDuration = f.NewHistogram(prometheus.HistogramOpts{Name: "gpurouter_sim_step_duration_seconds",
		Help: "Modelled duration of each engine step.", Buckets: ttftBuckets()})
	m.steps = f.NewCounter(prometheus.CounterOpts{Name: "gpurouter_sim_steps_total", Help: "Engine steps run."})
	if o.maxLoRAs > 0 {
		m.lora = newLoRAMetrics(f, o.maxLoRAs)
	}
	if o.kvTransfer {
		m.kv = newKVMetrics(f, labels, lv)
	}
	return m
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}

// finished records a sequence that ended, as vLLM's frontend does.
func (m *engineMetrics) finished(s *seq, reason finishReason, now time.Time) {
	if c := m.success[reason]; c != nil {
		c.Inc()
	}
	if reason == reasonAbort || reason == reasonError || s.firstToken.IsZero() {
		return
	}
	m.e2e.Observe(now.Sub(s.arrival).Seconds())
	m.queue.Observe(s.scheduled.Sub(s.queued).Seconds())
	m.prefill.Observe(s.firstToken.Sub(s.scheduled).Seconds())
	decode := s.lastToken.Sub(s.firstToken).Seconds()
	m.decode.Observe(decode)
	m.inference.Observe(s.lastToken.Sub(s.scheduled).Seconds())
	if s.output > 1 {
		m.tpot.Observe(decode / float64(s.output-1))
	} else {
		m.tpot.Observe(0)
	}
	m.reqPrompt.Observe(float64(s.prompt))
	m.reqGen.Observe(float64(s.output))
	m.maxTokensParam.Observe(float64(s.maxTokens))
}

func cacheInfo(p Profile, d derived) map[string]string {
	dtype := p.Engine.KVCacheDtype
	if dtype == "" {
		dtype = "auto"
	}
	pyBool := func(b bool) string {
		if b {
			return "True"
		}
		return "False"
	}
	override := "None"
	if p.Engine.NumGPUBlocksOverride > 0 {
		override = strconv.Itoa(p.Engine.NumGPUBlocksOverride)
	}
	return map[string]string{
		"block_size":              strconv.Itoa(d.blockSize),
		"cache_dtype":             dtype,
		"enable_prefix_caching":   pyBool(p.Engine.EnablePrefixCaching),
		"gpu_memory_utilization":  strconv.FormatFloat(p.Engine.GPUMemoryUtilization, 'g', -1, 64),
		"num_gpu_blocks":          strconv.Itoa(d.numGPUBlocks),
		"num_gpu_blocks_override": override,
		"num_cpu_blocks":          "None",
	}
}

// exposition renders a registry in Prometheus text format and keeps a short
// history of renderings, so that /metrics can be served as it was N seconds
// ago (the stale-metrics fault).
type exposition struct {
	gatherer prometheus.Gatherer

	mu    sync.Mutex // guards snaps
	snaps []snapshot // oldest first, one per snapshot call, spanning at most maxStaleHistory
}

type snapshot struct {
	at   time.Time
	body []byte
}

// maxStaleHistory bounds how far back stale metrics can go.
const maxStaleHistory = 2 * time.Minute

func (x *exposition) render() ([]byte, error) {
	mfs, err := x.gatherer.Gather()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// snapshot records the current rendering (for stale serving).
func (x *exposition) snapshot(now time.Time) {
	body, err := x.render()
	if err != nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	i := 0
	for i < len(x.snaps) && now.Sub(x.snaps[i].at) > maxStaleHistory {
		i++
	}
	x.snaps = append(x.snaps[i:], snapshot{at: now, body: body})
}

// at returns the rendering as of age ago: the newest snapshot at least that
// old, or the oldest one there is; live when age is 0 or no history exists.
func (x *exposition) at(now time.Time, age time.Duration) ([]byte, error) {
	if age > 0 {
		x.mu.Lock()
		var body []byte
		for _, s := range x.snaps {
			if now.Sub(s.at) < age && body != nil {
				break
			}
			body = s.body
		}
		x.mu.Unlock()
		if body != nil {
			return body, nil
		}
	}
	return x.render()
}
