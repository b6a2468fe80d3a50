package sim

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Built-in profiles. Hardware figures are vendor peaks (shared/calibration.md);
// efficiencies and overheads are calibrated so that the rows of calibration.md
// land within ±25% (see Calibrate). Each constructor returns a fresh value, so
// callers may modify what they get.

func hwA100() Hardware {
	return Hardware{
		Name: "NVIDIA A100-SXM4-80GB", MemoryGiB: 80, MemoryBandwidthGBps: 2039, BF16TFLOPS: 312,
		BandwidthEfficiency: 0.78, ComputeEfficiency: 0.6, InterconnectGBps: 300, InterconnectLatency: 10 * time.Microsecond,
		IdleWatts: 60, TDPWatts: 400, SMClockMaxMHz: 1410,
	}
}

func hwA10() Hardware {
	return Hardware{
		Name: "NVIDIA A10", MemoryGiB: 22.49, MemoryBandwidthGBps: 600, BF16TFLOPS: 125,
		BandwidthEfficiency: 0.75, ComputeEfficiency: 0.6, InterconnectGBps: 25, InterconnectLatency: 20 * time.Microsecond,
		IdleWatts: 20, TDPWatts: 150, SMClockMaxMHz: 1695,
	}
}

func hwH100() Hardware {
	return Hardware{
		Name: "NVIDIA H100 80GB HBM3", MemoryGiB: 79.65, MemoryBandwidthGBps: 3350, BF16TFLOPS: 989,
		BandwidthEfficiency: 0.81, ComputeEfficiency: 0.69, InterconnectGBps: 450, InterconnectLatency: 8 * time.Microsecond,
		IdleWatts: 70, TDPWatts: 700, SMClockMaxMHz: 1980,
	}
}

func hwH200() Hardware {
	h := hwH100()
	h.Name, h.MemoryGiB, h.MemoryBandwidthGBps = "NVIDIA H200", 140.4, 4800
	return h
}

func modelQwen25_7B() Model {
	return Model{
		Name: "Qwen/Qwen2.5-7B-Instruct", ParamsBillion: 7.61, BytesPerParam: 2,
		KVBytesPerToken: 57344, NumLayers: 28, HiddenSize: 3584, AttentionFLOPsPerPair: 4 * 28 * 3584,
		MaxModelLen: 32768, OutputLen: LengthDist{Median: 180, Sigma: 0.9},
	}
}

func modelTinyLlama() Model {
	return Model{
		Name: "TinyLlama/TinyLlama-1.1B-Chat-v1.0", ParamsBillion: 1.1, BytesPerParam: 2,
		KVBytesPerToken: 22528, NumLayers: 22, HiddenSize: 2048, AttentionFLOPsPerPair: 4 * 22 * 2048,
		MaxModelLen: 2048, OutputLen: LengthDist{Median: 180, Sigma: 0.9},
	}
}

// modelQwen35_9B: hybrid attention, only 8 of 32 layers are full attention
// and hold KV (4 KV heads × 256 dim), so KV per token is small.
func modelQwen35_9B() Model {
	return Model{
		Name: "Qwen/Qwen3.5-9B", ParamsBillion: 9.0, BytesPerParam: 2,
		KVBytesPerToken: 32768, NumLayers: 32, HiddenSize: 4096, AttentionFLOPsPerPair: 4 * 8 * 4096,
		MaxModelLen: 262144, OutputLen: LengthDist{Median: 300, Sigma: 1.0},
	}
}

func modelLlama3_8B() Model {
	return Model{
		Name: "meta-llama/Meta-Llama-3-8B-Instruct", ParamsBillion: 8.03, BytesPerParam: 2,
		KVBytesPerToken: 131072, NumLayers: 32, HiddenSize: 4096, AttentionFLOPsPerPair: 4 * 32 * 4096,
		MaxModelLen: 8192, OutputLen: LengthDist{Median: 180, Sigma: 0.9},
	}
}

// builtins returns every built-in profile, in ProfileNames order.
func builtins() []Profile {
	eng := DefaultEngine()

	qwen7 := Profile{
		Name:        "qwen2.5-7b",
		Description: "Qwen2.5-7B-Instruct bf16 on one A100 80GB (calibration row A)",
		Hardware:    hwA100(), Model: modelQwen25_7B(), Engine: eng,
		Overheads: Overheads{Step: 200 * time.Microsecond, PerSeq: 300 * time.Microsecond,
			API: 3 * time.Millisecond, APIPerPromptToken: time.Microsecond, ActivationReserveGiB: 2},
	}

	tiny := Profile{
		Name:        "tinyllama-1.1b-a10",
		Description: "TinyLlama-1.1B-Chat bf16 on one A10 24GB (calibration row B)",
		Hardware:    hwA10(), Model: modelTinyLlama(), Engine: eng,
		Overheads: Overheads{Step: 200 * time.Microsecond, PerSeq: 280 * time.Microsecond,
			API: 2 * time.Millisecond, APIPerPromptToken: time.Microsecond, ActivationReserveGiB: 1.5},
	}

	qwen9 := Profile{
		Name:        "qwen3.5-9b-h100",
		Description: "Qwen3.5-9B bf16 on one H100 80GB HBM3, vLLM 0.17, max-model-len 32768 (calibration row C)",
		Hardware:    hwH100(), Model: modelQwen35_9B(), Engine: eng,
		Overheads: Overheads{Step: 300 * time.Microsecond, PerSeq: 50 * time.Microsecond,
			API: 15 * time.Millisecond, APIPerPromptToken: 2 * time.Microsecond, ActivationReserveGiB: 4},
	}
	qwen9.Engine.MaxModelLen = 32768

	l8h200 := Profile{
		Name:        "llama3-8b-h200",
		Description: "Llama-3-8B-Instruct bf16 on one H200 141GB",
		Hardware:    hwH200(), Model: modelLlama3_8B(), Engine: eng,
		Overheads: Overheads{Step: 300 * time.Microsecond, PerSeq: 50 * time.Microsecond,
			API: 5 * time.Millisecond, APIPerPromptToken: time.Microsecond, ActivationReserveGiB: 4},
	}
	l8h100 := l8h200
	l8h100.Name = "llama3-8b-h100"
	l8h100.Description = "Llama-3-8B-Instruct bf16 on one H100 80GB HBM3"
	l8h100.Hardware = hwH100()

	l8a10 := Profile{
		Name:        "llama3-8b-a10",
		Description: "Llama-3-8B-Instruct bf16 on one A10 24GB (little KV room: ~30k tokens)",
		Hardware:    hwA10(), Model: modelLlama3_8B(), Engine: eng,
		Overheads: Overheads{Step: 200 * time.Microsecond, PerSeq: 300 * time.Microsecond,
			API: 3 * time.Millisecond, APIPerPromptToken: time.Microsecond, ActivationReserveGiB: 1.5},
	}

	return []Profile{qwen7, tiny, qwen9, l8h100, l8h200, l8a10}
}

// ProfileNames lists the built-in profiles.
func ProfileNames() []string {
	var names []string
	for _, p := range builtins() {
		names = append(names, p.Name)
	}
	return names
}

// Builtin returns a copy of the named built-in profile.
func Builtin(name string) (Profile, error) {
	all := builtins()
	i := slices.IndexFunc(all, func(p Profile) bool { return strings.EqualFold(p.Name, name) })
	if i < 0 {
		return Profile{}, fmt.Errorf("sim: no built-in profile %q (have %s)", name, strings.Join(ProfileNames(), ", "))
	}
	return all[i], nil
}
