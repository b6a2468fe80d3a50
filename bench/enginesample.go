package bench

import (
	"context"
	"math"
	"time"

	"github.com/gpurouter/gpurouter/gpu"
)

// Engine gauges and counters the sampler reads (vLLM V1 names; the KV
// gauge before vLLM 0.10 was vllm:gpu_cache_usage_perc).
const (
	metricKVUsage       = "vllm:kv_cache_usage_perc"
	metricKVUsageLegacy = "vllm:gpu_cache_usage_perc"
	metricPrefixHits    = "vllm:prefix_cache_hits_total"
	metricPrefixQueries = "vllm:prefix_cache_queries_total"
	metricPreemptions   = "vllm:num_preemptions_total"
	// metricLoRASwaps is the simulator's own count of LoRA adapters
	// swapped into GPU slots, by source (cpu, disk): vLLM has none.
	metricLoRASwaps = "gpurouter_sim_lora_swaps_total"
	// metricLoRAInfo is vLLM's adapter state, whose newest series (its
	// value is a timestamp) carries the engine's max_lora label.
	metricLoRAInfo = "vllm:lora_requests_info"
)

// EngineSampler reads every engine's /metrics while a run goes on: the KV
// cache's usage at each read, for its mean over the run (an instant scrape
// before and after cannot give one), and the prefix-cache and preemption
// counters at the first and last read, for their deltas (and the
// simulator's LoRA swap counter, where there is one). Call Run (it
// returns when ctx ends) and, once it has returned, Finish. Only URLs is
// required.
type EngineSampler struct {
	// URLs are the engines' /metrics URLs.
	URLs []string
	// Interval is the time between reads; 0 means 1 s.
	Interval time.Duration
	// Scraper reads /metrics; nil means a default Scraper.
	Scraper *Scraper
	// Clock paces the reads; nil means the real clock.
	Clock Clock

	kvSum   []float64
	kvN     []int
	first   []engineCounters
	last    []engineCounters
	errors  int
	started bool
}

type engineCounters struct {
	ok                             bool
	hits, queries, preemptions, kv float64
	hasKV                          bool
	swapsCPU, swapsDisk            float64
	hasSwaps                       bool
	maxLoRAs                       int
	pd                             PDUsage
}

// EngineUsage is one engine over a run.
type EngineUsage struct {
	URL string
	// MeanKVUsage is the mean of the KV-usage reads (a 0-1 fraction); NaN
	// when the engine never reported one.
	MeanKVUsage float64
	// KVSamples is how many reads the mean is over.
	KVSamples int
	// PrefixCacheHits and PrefixCacheQueries are tokens (vLLM counts
	// both in tokens), and Preemptions requests, between the first and
	// the last read.
	PrefixCacheHits, PrefixCacheQueries, Preemptions float64
	// LoRASwapsCPU and LoRASwapsDisk are LoRA adapters swapped into GPU
	// slots from the CPU cache and from disk between the first and the
	// last read, as the simulator counts them
	// (gpurouter_sim_lora_swaps_total); LoRASwapsRead says the engine
	// exposes that counter (a real vLLM does not).
	LoRASwapsCPU, LoRASwapsDisk float64
	LoRASwapsRead               bool
	// MaxLoRAs are the engine's GPU adapter slots (max_lora of its
	// vllm:lora_requests_info at the last read); 0 when it exposes none.
	MaxLoRAs int
	// PD is the engine's request phases and KV reads between the first
	// and the last read, for a split fleet's PDPhases.
	PD PDUsage
}

// PrefixCacheHitRate is hits over queries; NaN when nothing was queried.
func (u EngineUsage) PrefixCacheHitRate() float64 {
	if u.PrefixCacheQueries <= 0 {
		return math.NaN()
	}
	return u.PrefixCacheHits / u.PrefixCacheQueries
}

func (s *EngineSampler) init() {
	if s.started {
		return
	}
	s.started = true
	n := len(s.URLs)
	s.kvSum, s.kvN = make([]float64, n), make([]int, n)
	s.first, s.last = make([]engineCounters, n), make([]engineCounters, n)
	if s.Scraper == nil {
		s.Scraper = &Scraper{Timeout: 2 * time.Second}
	}
	if s.Clock == nil {
		s.Clock = realClock{}
	}
}

// Run reads every engine now and then every Interval until ctx ends.
func (s *EngineSampler) Run(ctx context.Context) {
	s.init()
	every := s.Interval
	if every <= 0 {
		every = time.Second
	}
	for {
		s.read(ctx)
		if s.Clock.Sleep(ctx, every) != nil {
			return
		}
	}
}

// Finish takes a last read (so the counters cover the end of the run) and
// returns each engine's usage, in URLs order. Call it after Run returned.
func (s *EngineSampler) Finish(ctx context.Context) []EngineUsage {
	s.init()
	s.read(ctx)
	out := make([]EngineUsage, len(s.URLs))
	for i, u := range s.URLs {
		out[i] = EngineUsage{URL: u, MeanKVUsage: math.NaN(), KVSamples: s.kvN[i]}
		if s.kvN[i] > 0 {
			out[i].MeanKVUsage = s.kvSum[i] / float64(s.kvN[i])
		}
		if f, l := s.first[i], s.last[i]; f.ok && l.ok {
			out[i].PrefixCacheHits = l.hits - f.hits
			out[i].PrefixCacheQueries = l.queries - f.queries
			out[i].Preemptions = l.preemptions - f.preemptions
			out[i].PD = l.pd.sub(f.pd)
			out[i].MaxLoRAs = l.maxLoRAs
			if f.hasSwaps && l.hasSwaps {
				out[i].LoRASwapsCPU, out[i].LoRASwapsDisk = l.swapsCPU-f.swapsCPU, l.swapsDisk-f.swapsDisk
				out[i].LoRASwapsRead = true
			}
		}
	}
	return out
}

// Errors is how many reads failed (an engine that did not answer).
func (s *EngineSampler) Errors() int { return s.errors }

func (s *EngineSampler) read(ctx context.Context) {
	for i, u := range s.URLs {
		snap, err := s.Scraper.Scrape(ctx, u)
		if err != nil {
			if ctx.Err() == nil {
				s.errors++
			}
			continue
		}
		c := countersOf(snap)
		if c.hasKV {
			s.kvSum[i] += c.kv
			s.kvN[i]++
		}
		if !s.first[i].ok {
			s.first[i] = c
		}
		s.last[i] = c
	}
}

func countersOf(snap Snapshot) engineCounters {
	c := engineCounters{ok: true}
	c.hits, _ = snap.sum(metricPrefixHits)
	c.queries, _ = snap.sum(metricPrefixQueries)
	c.preemptions, _ = snap.sum(metricPreemptions)
	var nc, nd int
	c.swapsCPU, nc = snap.sumWhere(metricLoRASwaps, "source", "cpu")
	c.swapsDisk, nd = snap.sumWhere(metricLoRASwaps, "source", "disk")
	c.hasSwaps = nc+nd > 0
	c.maxLoRAs = snap.maxLoRAs()
	c.pd = pdUsageOf(snap)
	kv, n := snap.sum(metricKVUsage)
	if n == 0 {
		kv, n = snap.sum(metricKVUsageLegacy)
	}
	if n > 0 {
		// An engine exposes one series per engine core: their mean.
		c.kv, c.hasKV = kv/float64(n), true
	}
	return c
}

// sum adds up a counter's or gauge's series; n is how many there were.
func (s Snapshot) sum(name string) (v float64, n int) { return s.sumWhere(name, "", "") }

// sumWhere is sum over the series whose label has that value (every
// series when label is "").
func (s Snapshot) sumWhere(name, label, value string) (v float64, n int) {
	fam := s[name]
	if fam == nil {
		return 0, 0
	}
	for _, m := range fam.GetMetric() {
		if label != "" && !labelsMatch(m.GetLabel(), map[string]string{label: value}) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			v += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			v += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			v += m.GetUntyped().GetValue()
		default:
			continue
		}
		n++
	}
	return v, n
}

// EngineUsageJSON is the result file's gpurouter_engine_usage: one object
// per engine.
func EngineUsageJSON(us []EngineUsage) []map[string]any {
	out := make([]map[string]any, len(us))
	for i, u := range us {
		out[i] = map[string]any{
			"url": u.URL, "mean_kv_usage": finiteOrNil(u.MeanKVUsage), "kv_samples": u.KVSamples,
			"prefix_cache_hits": u.PrefixCacheHits, "prefix_cache_queries": u.PrefixCacheQueries,
			"prefix_cache_hit_rate": finiteOrNil(u.PrefixCacheHitRate()), "preemptions": u.Preemptions,
		}
		if u.LoRASwapsRead {
			out[i]["lora_swaps_cpu"], out[i]["lora_swaps_disk"] = u.LoRASwapsCPU, u.LoRASwapsDisk
		}
	}
	return out
}

// LoRASwaps are the LoRA adapters the engines swapped into GPU slots over
// a run, summed over engines, next to the requests the run sent.
type LoRASwaps struct {
	CPU, Disk float64 // from the CPU cache, from disk
	Requests  int     // requests sent in the run
}

// PerKiloRequests is swaps (both kinds) per 1,000 requests sent; NaN with
// no request.
func (s LoRASwaps) PerKiloRequests() float64 {
	if s.Requests <= 0 {
		return math.NaN()
	}
	return 1000 * (s.CPU + s.Disk) / float64(s.Requests)
}

// TotalLoRASwaps adds up the engines' swaps; nil when no engine exposed
// the counter.
func TotalLoRASwaps(us []EngineUsage, requests int) *LoRASwaps {
	var out *LoRASwaps
	for _, u := range us {
		if !u.LoRASwapsRead {
			continue
		}
		if out == nil {
			out = &LoRASwaps{Requests: requests}
		}
		out.CPU += u.LoRASwapsCPU
		out.Disk += u.LoRASwapsDisk
	}
	return out
}

// maxLoRAs is the engine's max_lora, as the router reads it from the
// newest series of vllm:lora_requests_info (gpu.LoRAInfo); 0 without one.
func (s Snapshot) maxLoRAs() int {
	l, _ := gpu.LoRAInfo(s[metricLoRAInfo])
	return l.MaxLoRAs
}
