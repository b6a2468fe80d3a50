package sim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// LoRACosts are what serving LoRA adapters costs the simulated engine. They
// are simulator parameters, not vLLM flags; a zero field means its default.
//
// An adapter is rank × hidden × layers × 2 (A and B) × 2 bytes (bf16) ×
// TargetModules: 25.7 MB for Qwen2.5-7B at rank 16 over q, k, v and o.
// vLLM's LRUCacheWorkerLoRAManager keeps adapters in pinned CPU memory
// (max_cpu_loras of them) and copies the ones a batch needs into GPU slots
// (max_loras): an adapter in the CPU cache costs SwapFixed plus its bytes
// over the host-to-device link, one that is not costs LoadFixed plus its
// bytes from disk first. Both happen inside the engine step that needs the
// adapter, so every request in that batch waits for them. With the defaults
// a swap from the CPU cache takes ≈2 ms and a load from disk ≈65 ms on the
// 7B profiles. vLLM pins the CPU copies so that the copy runs at the link's
// speed (vllm-project/vllm#31317); the fixed costs cover the per-layer,
// per-module tensor copies, and on a load reading the checkpoint, building
// and pinning the tensors: assumptions, to be tuned against a measured load.
//
// The step itself grows with the adapters in the batch (vLLM's punica
// kernels run shrink and expand per adapter segment): PerAdapterStep per
// distinct adapter. The default, 0.9%, fits a measurement of vLLM 0.30 on
// an A10 (Qwen2.5-7B, rank-16 adapters over seven projections, eager mode):
// time per token +0.05–0.6% at 2 adapters, +1–2.2% at 4, +6.1% at 8 against
// one ("Eight LoRA adapters cost 6–7% more per token", 2026,
// github.com/MicheleCampi/lora-multitenancy-experiment).
type LoRACosts struct {
	// TargetModules is how many hidden×hidden projections per layer an
	// adapter adapts. 0 = 4 (q, k, v and o, with k and v counted at full
	// width: an upper bound under grouped-query attention).
	TargetModules float64 `yaml:"target_modules"`
	// HostToDeviceGBps is the pinned CPU-to-GPU copy bandwidth, 1e9
	// bytes/s per GPU. 0 = 25 (PCIe 4.0 x16 in practice).
	HostToDeviceGBps float64 `yaml:"host_to_device_gbps"`
	// SwapFixed is the fixed cost of copying an adapter into a GPU slot.
	// 0 = 1ms.
	SwapFixed time.Duration `yaml:"swap_fixed"`
	// DiskGBps is how fast an adapter's checkpoint is read, 1e9 bytes/s.
	// 0 = 2 (a local NVMe drive).
	DiskGBps float64 `yaml:"disk_gbps"`
	// LoadFixed is the fixed cost of loading an adapter from disk into the
	// CPU cache. 0 = 50ms.
	LoadFixed time.Duration `yaml:"load_fixed"`
	// PerAdapterStep is the fraction a step's time grows by per distinct
	// adapter in its batch. 0 = 0.009.
	PerAdapterStep float64 `yaml:"per_adapter_step"`
}

// loraDerived is a profile's LoRA settings with every default filled in.
type loraDerived struct {
	maxLoRAs, maxCPULoRAs, rank int
	adapterBytes                float64       // one adapter, whole (not per GPU)
	cpuSwap                     time.Duration // CPU cache → GPU slot
	diskLoad                    time.Duration // disk → CPU cache (the copy to the GPU comes on top)
	perAdapter                  float64
}

// loraRanks are the values vLLM accepts for --max-lora-rank.
func loraRanks() []int { return []int{1, 8, 16, 32, 64, 128, 256, 320, 512} }

func orDefault[T int | float64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

func deriveLoRA(p Profile) loraDerived {
	e, c, m := p.Engine, p.LoRA, p.Model
	d := loraDerived{maxLoRAs: orDefault(e.MaxLoRAs, 1), rank: orDefault(e.MaxLoRARank, 16)}
	d.maxCPULoRAs = orDefault(e.MaxCPULoRAs, d.maxLoRAs)
	d.adapterBytes = float64(d.rank) * float64(m.HiddenSize) * float64(m.NumLayers) * 2 * 2 * orDefault(c.TargetModules, 4)
	tp := float64(max(e.TensorParallelSize, 1))
	copySec := d.adapterBytes / tp / (orDefault(c.HostToDeviceGBps, 25) * 1e9)
	d.cpuSwap = orDefault(c.SwapFixed, time.Millisecond) + time.Duration(copySec*1e9)
	readSec := d.adapterBytes / (orDefault(c.DiskGBps, 2) * 1e9)
	d.diskLoad = orDefault(c.LoadFixed, 50*time.Millisecond) + time.Duration(readSec*1e9)
	d.perAdapter = orDefault(c.PerAdapterStep, 0.009)
	return d
}

// LoRASlots are the profile's effective max_loras, max_cpu_loras and
// max_lora_rank, vLLM's defaults filled in.
func (p Profile) LoRASlots() (maxLoRAs, maxCPULoRAs, maxRank int) {
	d := deriveLoRA(p)
	return d.maxLoRAs, d.maxCPULoRAs, d.rank
}

// validateLoRA checks the LoRA engine arguments as vLLM's LoRAConfig does,
// and what the cost model needs; nothing when LoRA is off.
func (p Profile) validateLoRA() []error {
	e, c := p.Engine, p.LoRA
	if !e.EnableLoRA {
		return nil
	}
	var errs []error
	if e.MaxLoRAs < 0 || e.MaxCPULoRAs < 0 || e.MaxLoRARank < 0 {
		errs = append(errs, errors.New("engine: max_loras, max_cpu_loras and max_lora_rank must be >= 0 (0 = vLLM's default)"))
		return errs
	}
	d := deriveLoRA(p)
	if d.maxCPULoRAs < d.maxLoRAs {
		errs = append(errs, fmt.Errorf("engine: max_cpu_loras (%d) must be >= max_loras (%d)", d.maxCPULoRAs, d.maxLoRAs))
	}
	if !slices.Contains(loraRanks(), d.rank) {
		errs = append(errs, fmt.Errorf("engine: max_lora_rank (%d) must be one of %v", d.rank, loraRanks()))
	}
	if p.Model.NumLayers <= 0 || p.Model.HiddenSize <= 0 {
		errs = append(errs, errors.New("engine: enable_lora needs model.num_layers and model.hidden_size (they size an adapter)"))
	}
	if c.TargetModules < 0 || c.HostToDeviceGBps < 0 || c.SwapFixed < 0 || c.DiskGBps < 0 || c.LoadFixed < 0 || c.PerAdapterStep < 0 {
		errs = append(errs, errors.New("lora: costs must be >= 0 (0 = the default)"))
	}
	return errs
}

// loraAdapter is one adapter a replica serves. Immutable once made.
type loraAdapter struct {
	// id is vLLM's lora_int_id: every load makes a new one, so a name
	// unloaded and loaded again is a new adapter, cold in every cache.
	id     int
	name   string // the model name requests use
	path   string // where vLLM would load it from; the simulator reads nothing
	parent string // the base model it adapts; "" = the replica's first served name
}

// Where an adapter swapped into a GPU slot came from (the source label of
// gpurouter_sim_lora_swaps_total).
const (
	swapFromCPU = iota
	swapFromDisk
)

// loraEngine is an engine's LoRA state: the adapters in GPU slots and in
// the CPU cache, each an LRU list as in vLLM's LRUCacheLoRAModelManager
// (most recently used last); the distinct adapters of the step being
// scheduled; and per adapter name how many requests run and wait, for
// vllm:lora_requests_info. Its owner guards it, as the engine's.
type loraEngine struct {
	d        loraDerived
	gpu, cpu []*loraAdapter
	step     []*loraAdapter // distinct adapters in the step being scheduled, at most maxLoRAs
	// stall is engine time owed by adapter loads made between steps
	// (POST /v1/load_lora_adapter): vLLM runs them on the engine's loop.
	stall time.Duration

	counts map[string]*loraCount
	order  []string // adapter names in first-seen order, as vLLM's dict keeps them
	dirty  bool     // an adapter started or stopped running or waiting
	m      *loraMetrics

	swaps    [2]int // by source, for reports
	swapTime [2]time.Duration
}

type loraCount struct{ running, waiting int }

func newLoRAEngine(d loraDerived, m *loraMetrics) *loraEngine {
	return &loraEngine{d: d, counts: map[string]*loraCount{}, m: m, dirty: true}
}

// startStep forgets the previous step's adapters.
func (le *loraEngine) startStep() { le.step = le.step[:0] }

// admits reports whether a request for a can join the step: vLLM's
// scheduler skips a waiting request whose adapter would make the batch's
// distinct adapters exceed max_loras; it waits for a later step.
func (le *loraEngine) admits(a *loraAdapter) bool {
	return a == nil || len(le.step) < le.d.maxLoRAs || slices.Contains(le.step, a)
}

// use records that a request for a is in the step.
func (le *loraEngine) use(a *loraAdapter) {
	if a != nil && !slices.Contains(le.step, a) {
		le.step = append(le.step, a)
	}
}

// stepTime is the duration of a step whose roofline time is base: the
// punica kernels' share for the step's adapters, the swaps that put them
// in GPU slots, and the loads made since the last step.
func (le *loraEngine) stepTime(base time.Duration) time.Duration {
	d := base + time.Duration(float64(base)*le.d.perAdapter*float64(len(le.step)))
	for _, a := range le.step {
		d += le.activate(a)
	}
	d += le.stall
	le.stall = 0
	return d
}

// idle drops load time owed when no step follows: nobody waits for it.
func (le *loraEngine) idle() { le.stall = 0 }

// activate makes a resident in a GPU slot, as vLLM's add_adapter: loaded
// from disk into the CPU cache when not there (the cache's least recently
// used adapter evicted, from its GPU slot too), then copied into a GPU
// slot when not there (the least recently used slot evicted). It returns
// the time that took and counts the swap.
func (le *loraEngine) activate(a *loraAdapter) time.Duration {
	var cost time.Duration
	src := -1
	if i := slices.Index(le.cpu, a); i >= 0 {
		le.cpu = append(slices.Delete(le.cpu, i, i+1), a)
	} else {
		if len(le.cpu) >= le.d.maxCPULoRAs {
			le.gpu = slices.DeleteFunc(le.gpu, func(x *loraAdapter) bool { return x == le.cpu[0] })
			le.cpu = slices.Delete(le.cpu, 0, 1)
		}
		le.cpu = append(le.cpu, a)
		cost += le.d.diskLoad
		src = swapFromDisk
	}
	if i := slices.Index(le.gpu, a); i >= 0 {
		le.gpu = append(slices.Delete(le.gpu, i, i+1), a)
	} else {
		if len(le.gpu) >= le.d.maxLoRAs {
			le.gpu = slices.Delete(le.gpu, 0, 1)
		}
		le.gpu = append(le.gpu, a)
		cost += le.d.cpuSwap
		if src < 0 {
			src = swapFromCPU
		}
	}
	if src >= 0 {
		le.swaps[src]++
		le.swapTime[src] += cost
		le.m.swapped(src, cost)
	}
	return cost
}

// preload puts a in the CPU cache and a GPU slot as vLLM does when it
// starts with --lora-modules: no time, no swap counted.
func (le *loraEngine) preload(a *loraAdapter) {
	swaps, times := le.swaps, le.swapTime
	m := le.m
	le.m = nil
	le.activate(a)
	le.m, le.swaps, le.swapTime = m, swaps, times
}

// load loads a at run time (POST /v1/load_lora_adapter): from disk into
// the CPU cache and a GPU slot, counted as a swap from disk, its time owed
// by the next step. It returns that time.
func (le *loraEngine) load(a *loraAdapter) time.Duration {
	d := le.activate(a)
	le.stall += d
	return d
}

// move changes a's running and waiting counts; a nil adapter (the base
// model) is not counted.
func (le *loraEngine) move(a *loraAdapter, waiting, running int) {
	if a == nil {
		return
	}
	c := le.counts[a.name]
	if c == nil {
		c = &loraCount{}
		le.counts[a.name] = c
		le.order = append(le.order, a.name)
	}
	wasW, wasR := c.waiting > 0, c.running > 0
	c.waiting += waiting
	c.running += running
	if (c.waiting > 0) != wasW || (c.running > 0) != wasR {
		le.dirty = true
	}
}

// labels are vllm:lora_requests_info's running_lora_adapters and
// waiting_lora_adapters: the names with a running (waiting) request,
// comma-joined in first-seen order, as vLLM up to 0.11 writes them. (Later
// versions write every name with a request, running or waiting, in both.)
func (le *loraEngine) labels() (running, waiting string) {
	var r, w strings.Builder
	for _, n := range le.order {
		c := le.counts[n]
		if c.running > 0 {
			if r.Len() > 0 {
				r.WriteByte(',')
			}
			r.WriteString(n)
		}
		if c.waiting > 0 {
			if w.Len() > 0 {
				w.WriteByte(',')
			}
			w.WriteString(n)
		}
	}
	return r.String(), w.String()
}

// publish sets vllm:lora_requests_info to now, under the current labels.
func (le *loraEngine) publish(now time.Time) {
	if le.m == nil {
		return
	}
	if le.dirty {
		le.m.relabel(le.labels())
		le.dirty = false
	}
	le.m.stamp(now)
}

// names lists adapters' names.
func names(as []*loraAdapter) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.name
	}
	return out
}
