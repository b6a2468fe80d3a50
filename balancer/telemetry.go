package balancer

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/gpu"
)

// EngineLoad is what a replica's engine last reported (vLLM /metrics), as
// the balancer needs it. The telemetry poller builds one per scrape; it is
// never modified after SetEngineLoad.
type EngineLoad struct {
	Running          int       // vllm:num_requests_running, summed over engines
	Waiting          int       // vllm:num_requests_waiting, summed over engines
	KVUsage          float64   // vllm:kv_cache_usage_perc, 0–1, averaged over engines
	KVCapacityTokens int       // num_gpu_blocks × block_size; 0 if unknown
	PrefixHitRate    float64   // prefix-cache hits / queries since the previous scrape, 0–1
	At               time.Time // when the scrape was taken
	// RequestsFinished is the engine's cumulative finished requests
	// (vllm:request_success_total); FinishedKnown says it reports them.
	// Engines that do not (false) get no estimate of other routers'
	// traffic (OthersPerS stays 0).
	RequestsFinished uint64
	FinishedKnown    bool
	// LoRAMax is the engine's max_lora (vllm:lora_requests_info): the most
	// distinct adapters one batch holds; 0 when it reports no LoRA state.
	LoRAMax int
	// loraActive is the keys (adapterKey) of the adapters with requests
	// running or waiting there, as that report says.
	loraActive []uint64
	// loraRunning is those of them with requests running (the keys of
	// running_lora_adapters).
	loraRunning []uint64
	// loraBound says the engine's batch is bound by its LoRA slots, not
	// by room (slotBound): its waiting requests wait for a slot for their
	// adapter, and a request for a running adapter joins the batch at
	// once, so they do not make the replica saturated (queued is 0).
	loraBound bool
	// OthersPerS is the rate, in requests per second, at which requests
	// this router did not send — other routers' — arrived at the replica
	// over the last scrapes (peers.go): 0 with one router.
	OthersPerS float64
	// othersCarry is this router's sends the engine had not yet counted
	// at the scrape (≤ 0), set against the next interval's arrivals.
	othersCarry float64

	// queued is the waiting requests this report and the one before it
	// both showed (SetEngineLoad): a queue the engine keeps, not the
	// requests that arrived during its current step and wait only for the
	// next. vLLM counts those as waiting too, so one scrape in a steady
	// stream often shows one or two; judged saturated on that, a replica
	// lost its turn to the others until the next scrape, whatever the
	// policy preferred (a full-speed replica handed its traffic to a
	// throttled one).
	queued int
}

// GPULoad is the GPU side of a replica's health and speed.
type GPULoad struct {
	// CapacityFactor scales the replica's capacity: 1 at full speed, lower
	// when the GPU throttles (thermal/power) or its SM clock is low.
	CapacityFactor float64
	// Fault is set when the GPU reported an Xid or uncorrected ECC error:
	// the replica receives no traffic until it clears.
	Fault bool
	At    time.Time
	// GPUs are the replica's GPUs as last read, in index order, for
	// operators (metrics, the status page); never modified once stored.
	GPUs []gpu.GPUStats `json:",omitempty"`
}

// telemetry is the part of a Replica fed by pollers and by the router's own
// measurements. Every field is an atomic or an immutable snapshot.
type telemetry struct {
	engine atomic.Pointer[EngineLoad]
	gpu    atomic.Pointer[GPULoad]
	// inFlightAtScrape and outstandingAtScrape are the router-side counts
	// when the engine snapshot was stored, so a picker can add what the
	// router sent (or saw finish) since: the snapshot is up to an interval old.
	inFlightAtScrape    atomic.Int64
	outstandingAtScrape atomic.Int64
	// servedAtScrape is the replica's served count at the last snapshot:
	// what it grew by since is this router's sends in the interval, which
	// the engine's arrivals are compared with (peers.go).
	servedAtScrape atomic.Int64
	// outstanding is the router's estimate of work still to do on the
	// replica, in tokens: prompt (weighted) plus expected output of every
	// request in flight, decremented as tokens stream back.
	outstanding atomic.Int64
	// speed is the learned decode speed in tokens/s (float64 bits), an EWMA
	// of per-request (tokens−1)/(last−first token); 0 until observed.
	speed atomic.Uint64
}

// SetEngineLoad stores a new engine snapshot (called by the poller, one
// call at a time per replica). It fills in OthersPerS.
func (r *Replica) SetEngineLoad(l EngineLoad) {
	l.queued = l.Waiting
	if prev := r.tel.engine.Load(); prev != nil {
		l.queued = min(l.Waiting, prev.Waiting)
	}
	if l.loraBound {
		l.queued = 0
	}
	inFlight, served := r.inFlight.Load(), r.served.Load()
	peerTraffic(&l, r.tel.engine.Load(), served-r.tel.servedAtScrape.Swap(served), inFlight)
	r.tel.inFlightAtScrape.Store(inFlight)
	r.tel.outstandingAtScrape.Store(r.tel.outstanding.Load())
	r.tel.engine.Store(&l)
	r.endRestIfRoom(&l)
}

// EngineLoad returns the last engine snapshot, nil if none yet.
func (r *Replica) EngineLoad() *EngineLoad { return r.tel.engine.Load() }

// SetGPULoad stores a new GPU snapshot (called by the poller).
func (r *Replica) SetGPULoad(g GPULoad) { r.tel.gpu.Store(&g) }

// GPULoad returns the last GPU snapshot, nil if none.
func (r *Replica) GPULoad() *GPULoad { return r.tel.gpu.Load() }

// OutstandingTokens is the router's estimate of the work in flight on the
// replica, in tokens.
func (r *Replica) OutstandingTokens() int64 { return r.tel.outstanding.Load() }

// DecodeSpeed is the learned decode speed in tokens/s (0 = not yet known).
func (r *Replica) DecodeSpeed() float64 { return math.Float64frombits(r.tel.speed.Load()) }

// speedAlpha weights a new per-request observation in the speed EWMA.
const speedAlpha = 0.1

// ObserveDecode learns the replica's decode speed from one finished
// request: tokens generated after the first, over the time they took.
func (r *Replica) ObserveDecode(tokens int, d time.Duration) {
	if tokens < 2 || d <= 0 {
		return
	}
	v := float64(tokens-1) / d.Seconds()
	for {
		old := r.tel.speed.Load()
		cur := math.Float64frombits(old)
		next := v
		if cur > 0 {
			next = cur + speedAlpha*(v-cur)
		}
		if r.tel.speed.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// capacity is the replica's relative capacity: its weight, scaled down by
// GPU throttling.
func (r *Replica) capacity() float64 {
	c := r.weight
	if g := r.tel.gpu.Load(); g != nil && g.CapacityFactor > 0 && g.CapacityFactor < 1 {
		c *= g.CapacityFactor
	}
	return c
}

// gpuFault reports a GPU health event that excludes the replica.
func (r *Replica) gpuFault() bool {
	g := r.tel.gpu.Load()
	return g != nil && g.Fault
}
