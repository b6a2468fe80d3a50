package sim

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gpurouter/gpurouter/gpu"
)

// gpuMeter turns the engine's cumulative busy time into NVML-style
// utilisation: the busy share of the last sample period (about a second).
type gpuMeter struct {
	mu        sync.Mutex // guards the samples
	prevAt    time.Time
	prevBusy  int64
	lastAt    time.Time
	lastBusy  int64
	sampleSet bool
}

func (g *gpuMeter) sample(now time.Time, busy int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.prevAt, g.prevBusy = g.lastAt, g.lastBusy
	g.lastAt, g.lastBusy = now, busy
	g.sampleSet = true
}

// utilization is the busy fraction since the older of the two last samples.
func (g *gpuMeter) utilization(now time.Time, busy int64) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	at, b := g.prevAt, g.prevBusy
	if at.IsZero() {
		at, b = g.lastAt, g.lastBusy
	}
	if at.IsZero() || now.Sub(at) < time.Millisecond {
		return 0
	}
	return min(1, max(0, float64(busy-b)/float64(now.Sub(at))))
}

// gpuStats describes the replica's simulated GPUs (one per tensor-parallel
// rank) the way `gpurouter agent` reports real ones.
func (r *Replica) gpuStats(now time.Time) []gpu.GPUStats {
	p := r.cfg.Profile
	h := p.Hardware
	f := r.faults.Load()
	util := r.gpuMeter.utilization(now, r.busyNanos.Load())
	r.mu.Lock()
	usedBlocks := r.eng.kv.n - r.eng.kv.nfree
	r.mu.Unlock()
	tp := float64(r.d.tp)
	kvBytes := float64(usedBlocks) * float64(r.d.blockSize) * r.d.kvBytesPerToken / tp
	used := r.d.weightBytes/tp + p.Overheads.ActivationReserveGiB*gib + kvBytes
	clock := h.SMClockMaxMHz
	if len(f.ThrottleReasons) > 0 {
		clock = clock * 6 / 10
	}
	out := make([]gpu.GPUStats, r.d.tp)
	for i := range out {
		out[i] = gpu.GPUStats{
			Index:            i,
			UUID:             fmt.Sprintf("GPU-5e1a0000-%04x-4000-8000-%012x", r.cfg.Index, i),
			Name:             h.Name,
			UtilizationPct:   100 * util,
			MemoryUsedBytes:  uint64(used),
			MemoryTotalBytes: uint64(h.MemoryGiB * gib),
			PowerWatts:       h.IdleWatts + (h.TDPWatts-h.IdleWatts)*util,
			PowerLimitWatts:  h.TDPWatts,
			TemperatureC:     32 + 45*util,
			SMClockMHz:       clock,
			SMClockMaxMHz:    h.SMClockMaxMHz,
			ThrottleReasons:  f.ThrottleReasons,
			XidErrors:        f.XidErrors,
		}
	}
	return out
}

func (r *Replica) serveGPUs(ctx *fasthttp.RequestCtx) {
	now := time.Now()
	host, _ := os.Hostname()
	writeJSON(ctx, fasthttp.StatusOK, gpu.HostReport{
		Host: fmt.Sprintf("%s-sim%d", host, r.cfg.Index),
		At:   now,
		GPUs: r.gpuStats(now),
	})
}
