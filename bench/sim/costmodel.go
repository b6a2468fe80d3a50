package sim

import (
	"math"
	"time"
)

// costModel times one engine step with a roofline: a step reads every weight
// once and the KV of every scheduled sequence (memory time), and does two
// FLOPs per parameter per new token plus attention against the context
// (compute time); the GPU is bound by the larger of the two. Tensor
// parallelism splits weights, KV and FLOPs over the GPUs and adds two
// all-reduces per layer. Host overheads add on top: a fixed per-step cost and
// a per-sequence cost.
type costModel struct {
	weightBytes   float64 // per GPU
	kvBytes       float64 // per token, per GPU
	bandwidth     float64 // effective bytes/s per GPU
	flops         float64 // effective FLOP/s per GPU
	linearFLOPs   float64 // per new token, per GPU (2 · params / tp)
	attnFLOPs     float64 // per (new token, context token) pair, per GPU
	tp            int
	allReduces    float64 // per step (2 per layer)
	commBytes     float64 // per new token per all-reduce (hidden · 2 bytes · 2(tp−1)/tp)
	commBandwidth float64 // bytes/s
	commLatency   time.Duration
	stepOverhead  time.Duration
	seqOverhead   time.Duration
}

func newCostModel(p Profile, d derived) costModel {
	tp := float64(d.tp)
	h := p.Hardware
	c := costModel{
		weightBytes:  d.weightBytes / tp,
		kvBytes:      d.kvBytesPerToken / tp,
		bandwidth:    h.MemoryBandwidthGBps * 1e9 * h.BandwidthEfficiency,
		flops:        h.BF16TFLOPS * 1e12 * h.ComputeEfficiency,
		linearFLOPs:  2 * p.Model.ParamsBillion * 1e9 / tp,
		attnFLOPs:    p.Model.AttentionFLOPsPerPair / tp,
		tp:           d.tp,
		stepOverhead: p.Overheads.Step,
		seqOverhead:  p.Overheads.PerSeq,
	}
	if d.tp > 1 {
		c.allReduces = 2 * float64(p.Model.NumLayers)
		c.commBytes = float64(p.Model.HiddenSize) * 2 * 2 * (tp - 1) / tp
		c.commBandwidth = h.InterconnectGBps * 1e9
		if c.commBandwidth == 0 {
			c.commBandwidth = 25e9
		}
		c.commLatency = h.InterconnectLatency
		if c.commLatency == 0 {
			c.commLatency = 10 * time.Microsecond
		}
	}
	return c
}

// stepLoad summarises a batch for the cost model.
type stepLoad struct {
	seqs    int     // sequences in the step
	tokens  int     // new tokens computed (prefill chunks + one per decode)
	kvRead  float64 // context tokens whose KV is read, plus the new tokens written
	attPair float64 // Σ new tokens × (context before them + half their own count)
}

// add accounts one sequence computing n new tokens after ctx cached ones.
func (l *stepLoad) add(ctx, n int) {
	l.seqs++
	l.tokens += n
	l.kvRead += float64(ctx + n)
	l.attPair += float64(n) * (float64(ctx) + float64(n)/2)
}

// stepTime is the modelled duration of a step with this load.
func (c *costModel) stepTime(l stepLoad) time.Duration {
	if l.seqs == 0 {
		return 0
	}
	mem := (c.weightBytes + c.kvBytes*l.kvRead) / c.bandwidth
	cmp := (c.linearFLOPs*float64(l.tokens) + c.attnFLOPs*l.attPair) / c.flops
	sec := math.Max(mem, cmp)
	if c.tp > 1 {
		sec += c.allReduces * (c.commLatency.Seconds() + c.commBytes*float64(l.tokens)/c.commBandwidth)
	}
	return time.Duration(sec*1e9) + c.stepOverhead + time.Duration(l.seqs)*c.seqOverhead
}
