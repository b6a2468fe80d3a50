package gpu

import (
	"context"
	"errors"
	"time"
)

// Errors returned by the sources and the poller. Check them with errors.Is;
// the returned errors wrap these with detail (URL, status, missing UUID).
var (
	// ErrGPUOff means GPU telemetry is off in this process: the NVIDIA
	// driver's libnvidia-ml.so.1 is absent or NVML failed to initialise.
	// It is permanent for the life of the NVML session; the poller stops
	// asking a source that returns it.
	ErrGPUOff = errors.New("gpu: GPU telemetry off")
	// ErrGPUNotFound means a Selector named a GPU (index or UUID) that the
	// host does not report: a binding mistake in the configuration.
	ErrGPUNotFound = errors.New("gpu: selected GPU not found")
	// ErrNoEngineMetrics means a replica answered but exposes no engine
	// metrics the router reads: the body names no known engine (vLLM,
	// SGLang, llama.cpp, TGI) or none of its load families (running,
	// waiting, KV usage), or /metrics is 404 or 501 (metrics not enabled).
	// It is not a scrape failure: the poller logs it once per replica and
	// scrapes that replica with backoff, and with no engine snapshot the
	// router routes the replica on its own counts.
	ErrNoEngineMetrics = errors.New("gpu: no engine metrics in response")
	// ErrMalformed means a line of a family we need could not be parsed.
	ErrMalformed = errors.New("gpu: malformed metrics exposition")
	// ErrHTTPStatus means a scrape got a status other than 200.
	ErrHTTPStatus = errors.New("gpu: unexpected HTTP status")
)

// Source reads the GPUs bound to one replica: local NVML (NVMLSource), a
// `gpurouter agent` on the replica's host (AgentSource) or a DCGM exporter
// (DCGMSource). Fetch returns the selected GPUs in index order and must
// honour ctx's deadline where it does I/O. It returns ErrGPUOff when GPU
// telemetry is unavailable in this process, and is safe for concurrent use.
type Source interface {
	Fetch(ctx context.Context) ([]GPUStats, error)
}

// EngineSource reads one replica's engine state; EngineScraper implements
// it over the engine's /metrics (vLLM, SGLang, llama.cpp, TGI). Fetch
// returns a fresh EngineStats that the caller may complete (the poller sets
// At, Latency and the per-interval deltas) before publishing it.
type EngineSource interface {
	Fetch(ctx context.Context) (*EngineStats, error)
}

// Sink receives a replica's published snapshots; *balancer.Replica
// implements it. Both methods are called from the poller's goroutines, one
// call at a time per Sink and kind, and must not block: store the pointer
// (an atomic.Pointer) and return. Snapshots are immutable once stored.
type Sink interface {
	StoreEngine(s *EngineStats)
	StoreGPU(s *GPUSnapshot)
}

// GPUSnapshot is what a Source reported for one replica at one instant.
// A replica whose Sink has never received one has no GPU signal (no binding,
// or telemetry off): consumers must treat that as "unknown", not "idle".
type GPUSnapshot struct {
	GPUs    []GPUStats    // the replica's GPUs in index order; never modified after StoreGPU
	At      time.Time     // when the fetch completed (the poller's clock)
	Latency time.Duration // how long the fetch took
}

// Age is how old g is at now; a nil snapshot is infinitely old.
func (g *GPUSnapshot) Age(now time.Time) time.Duration {
	if g == nil || g.At.IsZero() {
		return maxDuration
	}
	return now.Sub(g.At)
}
