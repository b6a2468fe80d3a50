// Package gpu owns telemetry sources: what the engines (vLLM /metrics) and
// the GPUs (NVML, gpurouter agent, DCGM exporter) report about a replica. It
// makes no decisions; the balancer and admission read its snapshots.
package gpu

import "time"

// GPUStats is one GPU as seen at one instant. It is also the JSON shape that
// `gpurouter agent` serves and that the simulator's GPU endpoint imitates, so
// the router reads real and simulated GPUs through one decoder. A zero field
// means "not reported" (a source that can't read power leaves PowerWatts 0).
type GPUStats struct {
	Index            int      `json:"index"`
	UUID             string   `json:"uuid"`
	Name             string   `json:"name,omitempty"`
	UtilizationPct   float64  `json:"utilization_pct"` // 0–100, SM busy time over the last sample period
	MemoryUsedBytes  uint64   `json:"memory_used_bytes"`
	MemoryTotalBytes uint64   `json:"memory_total_bytes"`
	PowerWatts       float64  `json:"power_watts"`
	PowerLimitWatts  float64  `json:"power_limit_watts,omitempty"`
	TemperatureC     float64  `json:"temperature_c"`
	SMClockMHz       uint32   `json:"sm_clock_mhz"`
	SMClockMaxMHz    uint32   `json:"sm_clock_max_mhz,omitempty"`
	ThrottleReasons  []string `json:"throttle_reasons,omitempty"` // NVML clock-event reasons, e.g. "hw_thermal_slowdown", "sw_power_cap"
	XidErrors        uint64   `json:"xid_errors"`                 // critical Xid events seen since the source started
	ECCUncorrected   uint64   `json:"ecc_uncorrected"`            // volatile uncorrected ECC errors
}

// HostReport is the document `gpurouter agent` serves at /v1/gpus: every GPU
// on one host at one instant.
type HostReport struct {
	Host string     `json:"host"`
	At   time.Time  `json:"at"`
	GPUs []GPUStats `json:"gpus"`
}
