package balancer_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
)

// TestCollectorTelemetry: the engine's load and every GPU as last read
// appear under the router's model and replica labels, and only once a
// snapshot has arrived — a replica not yet scraped has no series, never a
// misleading zero.
func TestCollectorTelemetry(t *testing.T) {
	c := newFakeClock()
	a := newReplica(t, "a", c, replicaOpts{})
	b := newReplica(t, "b", c, replicaOpts{})
	pool := newPool(t, "llama", a, b)
	reg := newRegistry(t, balancer.NewCollector(func() []*balancer.Pool { return []*balancer.Pool{pool} }))
	at := time.Unix(1000, 0)
	a.StoreEngine(&gpu.EngineStats{Running: 3, Waiting: 2, KVUsage: 0.25, At: at})
	a.StoreGPU(&gpu.GPUSnapshot{At: at, GPUs: []gpu.GPUStats{
		{Index: 0, UUID: "GPU-0", UtilizationPct: 50, MemoryUsedBytes: 1 << 30, MemoryTotalBytes: 2 << 30, PowerWatts: 300, TemperatureC: 60,
			SMClockMHz: 900, SMClockMaxMHz: 1800, ThrottleReasons: []string{"sw_power_cap"}},
		{Index: 1, UUID: "GPU-1", UtilizationPct: 100, MemoryUsedBytes: 1 << 30, MemoryTotalBytes: 2 << 30, PowerWatts: 400, TemperatureC: 70},
	}})
	assertScrape(t, reg, `# HELP gpurouter_replica_engine_running_requests Requests the engine reported running at the last telemetry scrape (vllm:num_requests_running, summed over engines).
# TYPE gpurouter_replica_engine_running_requests gauge
gpurouter_replica_engine_running_requests{model="llama",replica="a"} 3
# HELP gpurouter_replica_engine_waiting_requests Requests the engine reported waiting at the last telemetry scrape (vllm:num_requests_waiting, summed over engines).
# TYPE gpurouter_replica_engine_waiting_requests gauge
gpurouter_replica_engine_waiting_requests{model="llama",replica="a"} 2
# HELP gpurouter_replica_gpu_capacity_ratio Share of full speed the router credits the replica with: its slowest GPU's SM clock over the maximum while throttled, else 1.
# TYPE gpurouter_replica_gpu_capacity_ratio gauge
gpurouter_replica_gpu_capacity_ratio{model="llama",replica="a"} 0.5
# HELP gpurouter_replica_gpu_throttled 1 while the GPU reports a clock slowdown reason (thermal, power cap), as last read.
# TYPE gpurouter_replica_gpu_throttled gauge
gpurouter_replica_gpu_throttled{gpu="0",model="llama",replica="a"} 1
gpurouter_replica_gpu_throttled{gpu="1",model="llama",replica="a"} 0
# HELP gpurouter_replica_gpu_utilization_ratio GPU busy share over its last sample period, as last read.
# TYPE gpurouter_replica_gpu_utilization_ratio gauge
gpurouter_replica_gpu_utilization_ratio{gpu="0",model="llama",replica="a"} 0.5
gpurouter_replica_gpu_utilization_ratio{gpu="1",model="llama",replica="a"} 1
# HELP gpurouter_replica_kv_cache_usage_ratio KV-cache usage the engine reported at the last telemetry scrape, 0-1 (averaged over engines).
# TYPE gpurouter_replica_kv_cache_usage_ratio gauge
gpurouter_replica_kv_cache_usage_ratio{model="llama",replica="a"} 0.25
`, "gpurouter_replica_engine_running_requests", "gpurouter_replica_engine_waiting_requests", "gpurouter_replica_kv_cache_usage_ratio",
		"gpurouter_replica_gpu_capacity_ratio", "gpurouter_replica_gpu_utilization_ratio", "gpurouter_replica_gpu_throttled")

	// 3 state series per replica, 3 engine series and 2 GPU-level ones
	// for a, and 6 per GPU.
	if _, got := scrape(t, reg); got != 2*3+3+2+2*6 {
		t.Errorf("%d series, want %d", got, 2*3+3+2+2*6)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
