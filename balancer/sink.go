package balancer

import (
	"time"

	"github.com/gpurouter/gpurouter/gpu"
)

var _ gpu.Sink = (*Replica)(nil)

// faultHold is how long a replica stays excluded after its GPU's Xid or
// uncorrected-ECC counter last grew: long enough for an operator to look,
// short enough that a recovered GPU returns without a router restart.
const faultHold = 10 * time.Minute

// throttledFactor is the capacity assumed for a GPU that reports a
// slowdown reason but no clocks to measure it by.
const throttledFactor = 0.5

// StoreEngine implements gpu.Sink: the poller's engine snapshot becomes the
// replica's EngineLoad.
func (r *Replica) StoreEngine(s *gpu.EngineStats) {
	if s == nil {
		return
	}
	e := EngineLoad{
		Running:          s.Running,
		Waiting:          s.Waiting,
		KVUsage:          s.KVUsage,
		KVCapacityTokens: s.KVCapacityTokens,
		PrefixHitRate:    s.PrefixCacheHitRate,
		At:               s.At,
		RequestsFinished: s.RequestsFinished,
		FinishedKnown:    s.Reported.Has(gpu.FieldFinished),
	}
	r.storeLoRA(&e, s)
	r.SetEngineLoad(e)
}

// StoreGPU implements gpu.Sink: the replica's GPUs become one GPULoad. The
// slowest GPU sets the capacity (a tensor-parallel replica runs at the pace
// of its slowest GPU); any growth of an Xid or uncorrected-ECC counter
// excludes the replica for faultHold. The poller calls it from one
// goroutine at a time per replica, so the previous counters need no lock.
func (r *Replica) StoreGPU(s *gpu.GPUSnapshot) {
	if s == nil {
		return
	}
	factor := 1.0
	var errs uint64
	for _, g := range s.GPUs {
		factor = min(factor, gpuCapacityFactor(g))
		errs += g.XidErrors + g.ECCUncorrected
	}
	if errs > r.gpuErrs {
		r.faultSince = s.At
	}
	r.gpuErrs = errs
	fault := !r.faultSince.IsZero() && s.At.Sub(r.faultSince) < faultHold
	r.SetGPULoad(GPULoad{CapacityFactor: factor, Fault: fault, At: s.At, GPUs: s.GPUs})
}

// gpuCapacityFactor is the fraction of its normal speed a GPU runs at: its
// SM clock over its maximum when it reports a slowdown reason (thermal,
// power), else 1. A GPU that is idle at a low clock is not slow.
func gpuCapacityFactor(g gpu.GPUStats) float64 {
	if len(g.ThrottleReasons) == 0 {
		return 1
	}
	if g.SMClockMHz > 0 && g.SMClockMaxMHz > 0 && g.SMClockMHz < g.SMClockMaxMHz {
		return max(0.05, float64(g.SMClockMHz)/float64(g.SMClockMaxMHz))
	}
	return throttledFactor
}
