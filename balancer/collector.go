package balancer

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exposes every replica's live state at scrape time (in-flight,
// health, breaker), read from the atomics rather than mirrored by a ticker,
// and the telemetry the router routes on: the engine's load and the GPUs
// as last read, whatever the source (NVML, agent, DCGM exporter), under
// the router's own model and replica labels so that one dashboard joins
// them with the router's latency series. Telemetry series exist only once
// a snapshot has arrived.
type Collector struct {
	pools                     func() []*Pool
	inFlight, healthy         *prometheus.Desc
	breaker                   *prometheus.Desc
	running, waiting, kvUsage *prometheus.Desc
	capacity, gpuFault        *prometheus.Desc
	util, memUsed, memTotal   *prometheus.Desc
	power, temp, throttled    *prometheus.Desc
	prefixBlocks              *prometheus.Desc
	prefixPrompt, prefixHits  *prometheus.Desc
	prefixForgone             *prometheus.Desc
}

// NewCollector builds a collector over the current pools.
func NewCollector(pools func() []*Pool) *Collector {
	labels := []string{"model", "replica"}
	gpuLabels := []string{"model", "replica", "gpu"}
	d := prometheus.NewDesc
	return &Collector{
		pools:    pools,
		inFlight: d("gpurouter_replica_in_flight_requests", "Requests sent to the replica and not yet finished.", labels, nil),
		healthy:  d("gpurouter_replica_healthy", "1 when the replica's active health check passes.", labels, nil),
		breaker:  d("gpurouter_replica_breaker_open", "1 when the replica's circuit breaker is open or half-open.", labels, nil),
		running:  d("gpurouter_replica_engine_running_requests", "Requests the engine reported running at the last telemetry scrape (vllm:num_requests_running, summed over engines).", labels, nil),
		waiting:  d("gpurouter_replica_engine_waiting_requests", "Requests the engine reported waiting at the last telemetry scrape (vllm:num_requests_waiting, summed over engines).", labels, nil),
		kvUsage:  d("gpurouter_replica_kv_cache_usage_ratio", "KV-cache usage the engine reported at the last telemetry scrape, 0-1 (averaged over engines).", labels, nil),
		capacity: d("gpurouter_replica_gpu_capacity_ratio", "Share of full speed the router credits the replica with: its slowest GPU's SM clock over the maximum while throttled, else 1.", labels, nil),
		gpuFault: d("gpurouter_replica_gpu_fault", "1 while the replica is excluded for a GPU Xid or uncorrected ECC error.", labels, nil),
		util:     d("gpurouter_replica_gpu_utilization_ratio", "GPU busy share over its last sample period, as last read.", gpuLabels, nil),
		memUsed:  d("gpurouter_replica_gpu_memory_used_bytes", "GPU framebuffer memory in use, as last read.", gpuLabels, nil),
		memTotal: d("gpurouter_replica_gpu_memory_total_bytes", "GPU framebuffer memory installed.", gpuLabels, nil),
		power:    d("gpurouter_replica_gpu_power_watts", "GPU power draw, as last read.", gpuLabels, nil),
		temp:     d("gpurouter_replica_gpu_temperature_celsius", "GPU core temperature, as last read.", gpuLabels, nil),
		throttled: d("gpurouter_replica_gpu_throttled", "1 while the GPU reports a clock slowdown reason (thermal, power cap), as last read.",
			gpuLabels, nil),
		prefixBlocks: d("gpurouter_replica_prefix_index_blocks", "Prompt blocks the pool's prefix index says the replica holds cached.", labels, nil),
		prefixPrompt: d("gpurouter_replica_prefix_prompt_tokens_total", "Prompt tokens of requests placed on the replica with prefix-index keys.", labels, nil),
		prefixHits: d("gpurouter_replica_prefix_predicted_cached_tokens_total",
			"Of those, the tokens the prefix index predicted the replica had cached: over prompt tokens, the router's predicted prefix-cache hit rate.", labels, nil),
		prefixForgone: d("gpurouter_replica_prefix_forgone_cached_tokens_total",
			"Of those prompts, the tokens beyond the replica's predicted hits that another replica held cached, as the prefix index said: cache affinity given up for load or an objective.", labels, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.inFlight, c.healthy, c.breaker, c.running, c.waiting, c.kvUsage,
		c.capacity, c.gpuFault, c.util, c.memUsed, c.memTotal, c.power, c.temp, c.throttled,
		c.prefixBlocks, c.prefixPrompt, c.prefixHits, c.prefixForgone} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.pools() {
		for _, r := range p.Replicas() {
			gauge := func(d *prometheus.Desc, v float64, extra ...string) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{p.Model(), r.Name()}, extra...)...)
			}
			gauge(c.inFlight, float64(r.InFlight()))
			gauge(c.healthy, b2f(r.Healthy()))
			gauge(c.breaker, b2f(r.BreakerState() != "closed"))
			if e := r.EngineLoad(); e != nil {
				gauge(c.running, float64(e.Running))
				gauge(c.waiting, float64(e.Waiting))
				gauge(c.kvUsage, e.KVUsage)
			}
			if ps := r.PrefixStats(); ps != nil {
				gauge(c.prefixBlocks, float64(ps.Blocks))
				ch <- prometheus.MustNewConstMetric(c.prefixPrompt, prometheus.CounterValue, float64(ps.PromptTokens), p.Model(), r.Name())
				ch <- prometheus.MustNewConstMetric(c.prefixHits, prometheus.CounterValue, float64(ps.CachedTokens), p.Model(), r.Name())
				ch <- prometheus.MustNewConstMetric(c.prefixForgone, prometheus.CounterValue, float64(ps.ForgoneTokens), p.Model(), r.Name())
			}
			g := r.GPULoad()
			if g == nil {
				continue
			}
			gauge(c.capacity, g.CapacityFactor)
			gauge(c.gpuFault, b2f(g.Fault))
			for _, s := range g.GPUs {
				idx := strconv.Itoa(s.Index)
				gauge(c.util, s.UtilizationPct/100, idx)
				gauge(c.memUsed, float64(s.MemoryUsedBytes), idx)
				gauge(c.memTotal, float64(s.MemoryTotalBytes), idx)
				gauge(c.power, s.PowerWatts, idx)
				gauge(c.temp, s.TemperatureC, idx)
				gauge(c.throttled, b2f(len(s.ThrottleReasons) > 0), idx)
			}
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
