package sim

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Profile describes one simulated system: the GPU, the model on it and the
// vLLM engine settings. Profiles are data: built-ins come from Builtin, users
// write their own in YAML (LoadProfile) and tune engine knobs with Set. The
// zero value is not usable; start from Builtin or DefaultEngine.
type Profile struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description,omitempty"`
	// Base names a built-in profile that a file starts from; only its own
	// fields are then overridden. Empty in resolved profiles.
	Base      string    `yaml:"base,omitempty"`
	Hardware  Hardware  `yaml:"hardware"`
	Model     Model     `yaml:"model"`
	Engine    Engine    `yaml:"engine"`
	Overheads Overheads `yaml:"overheads"`
	// LoRA is what serving LoRA adapters costs; it matters only with
	// Engine.EnableLoRA. The zero value is the defaults (lora.go).
	LoRA LoRACosts `yaml:"lora,omitempty"`
}

// Hardware is one GPU. Efficiencies are the fractions of the peak figures
// that vLLM's kernels reach; they are what calibration tunes.
type Hardware struct {
	Name                string  `yaml:"name"`                  // as NVML reports it, e.g. "NVIDIA H100 80GB HBM3"
	MemoryGiB           float64 `yaml:"memory_gib"`            // GPU memory, GiB
	MemoryBandwidthGBps float64 `yaml:"memory_bandwidth_gbps"` // peak, 1e9 bytes/s
	BF16TFLOPS          float64 `yaml:"bf16_tflops"`           // dense bf16 peak, 1e12 FLOP/s
	BandwidthEfficiency float64 `yaml:"bandwidth_efficiency"`  // (0,1]: share of peak bandwidth a decode step reaches
	ComputeEfficiency   float64 `yaml:"compute_efficiency"`    // (0,1]: share of peak FLOP/s a prefill step reaches
	// InterconnectGBps is the per-GPU all-reduce bandwidth used by tensor
	// parallelism (NVLink ≈ 450, PCIe ≈ 25), 1e9 bytes/s. 0 = 25.
	InterconnectGBps float64 `yaml:"interconnect_gbps"`
	// InterconnectLatency is the fixed cost of one all-reduce. 0 = 10µs.
	InterconnectLatency time.Duration `yaml:"interconnect_latency"`
	IdleWatts           float64       `yaml:"idle_watts"`       // power when no step runs
	TDPWatts            float64       `yaml:"tdp_watts"`        // power at full utilisation
	SMClockMaxMHz       uint32        `yaml:"sm_clock_max_mhz"` // boost clock
}

// Model is the served model as far as cost and memory are concerned.
type Model struct {
	Name          string  `yaml:"name"`           // HF id; the default served model name
	ParamsBillion float64 `yaml:"params_billion"` // parameters, 1e9
	BytesPerParam float64 `yaml:"bytes_per_param"`
	// KVBytesPerToken is the KV cache of one token over all layers at 16-bit
	// precision: 2 (K,V) · layers with KV · KV heads · head dim · 2 bytes.
	KVBytesPerToken float64 `yaml:"kv_bytes_per_token"`
	NumLayers       int     `yaml:"num_layers"`  // for tensor-parallel all-reduces; 0 = no TP cost model
	HiddenSize      int     `yaml:"hidden_size"` // for tensor-parallel all-reduces
	// AttentionFLOPsPerPair is the attention cost of one new token against
	// one context token (4 · attention layers · query width); 0 ignores the
	// quadratic term, which matters only for long prompts.
	AttentionFLOPsPerPair float64 `yaml:"attention_flops_per_pair"`
	MaxModelLen           int     `yaml:"max_model_len"` // native context length, tokens
	// OutputLen is how long the model's answers are when a request doesn't
	// force its length with ignore_eos (capped by max_tokens).
	OutputLen LengthDist `yaml:"output_len"`
}

// LengthDist is a log-normal distribution of token counts. Sigma 0 means
// always Median.
type LengthDist struct {
	Median int     `yaml:"median"`
	Sigma  float64 `yaml:"sigma"`
}

// Engine holds vLLM's engine arguments, under vLLM's own names (snake_case
// here and in YAML, --dash-case as flags and in Set).
type Engine struct {
	MaxNumSeqs           int     `yaml:"max_num_seqs"`
	MaxNumBatchedTokens  int     `yaml:"max_num_batched_tokens"`
	EnableChunkedPrefill bool    `yaml:"enable_chunked_prefill"`
	EnablePrefixCaching  bool    `yaml:"enable_prefix_caching"`
	GPUMemoryUtilization float64 `yaml:"gpu_memory_utilization"`
	MaxModelLen          int     `yaml:"max_model_len"`           // 0 = the model's
	KVCacheDtype         string  `yaml:"kv_cache_dtype"`          // auto|bfloat16|float16|fp8|fp8_e4m3|fp8_e5m2; "" = auto
	TensorParallelSize   int     `yaml:"tensor_parallel_size"`    // 0 = 1
	Quantization         string  `yaml:"quantization"`            // ""/none, fp8, int8, w8a8, awq, gptq, …: sets bytes per parameter
	BlockSize            int     `yaml:"block_size"`              // tokens per KV block; 0 = 16
	NumGPUBlocksOverride int     `yaml:"num_gpu_blocks_override"` // 0 = derived from memory

	// EnableLoRA serves LoRA adapters (--enable-lora): a request names
	// its adapter as its model, and a batch holds requests of at most
	// MaxLoRAs distinct adapters. vLLM's defaults: MaxLoRAs 1 (0 here
	// means that), MaxCPULoRAs = MaxLoRAs (0), MaxLoRARank 16 (0).
	EnableLoRA  bool `yaml:"enable_lora"`
	MaxLoRAs    int  `yaml:"max_loras"`     // adapters in GPU slots, and in one batch
	MaxCPULoRAs int  `yaml:"max_cpu_loras"` // adapters cached in CPU memory (LRU)
	MaxLoRARank int  `yaml:"max_lora_rank"` // every slot's rank, and the simulated adapters'
}

// Overheads are the host-side costs the GPU roofline doesn't see. They are
// simulator parameters, not vLLM flags, and are set by calibration.
type Overheads struct {
	Step   time.Duration `yaml:"step"`    // fixed per engine step (launches, scheduling)
	PerSeq time.Duration `yaml:"per_seq"` // per running sequence per step (sampling, detokenisation, output processing)
	// API is the frontend's time before the engine sees a request (HTTP,
	// JSON, chat template); APIPerPromptToken adds tokenisation.
	API               time.Duration `yaml:"api"`
	APIPerPromptToken time.Duration `yaml:"api_per_prompt_token"`
	// ActivationReserveGiB is GPU memory held for activations, CUDA graphs
	// and the runtime, per GPU: neither weights nor KV cache.
	ActivationReserveGiB float64 `yaml:"activation_reserve_gib"`
}

// DefaultEngine returns vLLM's defaults for the engine arguments.
func DefaultEngine() Engine {
	return Engine{
		MaxNumSeqs:           256,
		MaxNumBatchedTokens:  8192,
		EnableChunkedPrefill: true,
		EnablePrefixCaching:  true,
		GPUMemoryUtilization: 0.9,
		KVCacheDtype:         "auto",
		TensorParallelSize:   1,
		BlockSize:            16,
	}
}

// LoadProfile reads a profile from a YAML file. Unknown keys are errors. A
// file may name a built-in as `base:` and override only some fields;
// otherwise engine fields start from vLLM's defaults. The result is
// validated.
func LoadProfile(path string) (Profile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Profile{}, fmt.Errorf("sim: load profile: %w", err)
	}
	p, err := ParseProfile(data)
	if err != nil {
		return Profile{}, fmt.Errorf("sim: load profile %s: %w", path, err)
	}
	return p, nil
}

// ParseProfile is LoadProfile on YAML bytes.
func ParseProfile(data []byte) (Profile, error) {
	var head struct {
		Base string `yaml:"base"`
	}
	if err := yaml.Unmarshal(data, &head); err != nil {
		return Profile{}, err
	}
	p := Profile{Engine: DefaultEngine()}
	if head.Base != "" {
		b, err := Builtin(head.Base)
		if err != nil {
			return Profile{}, err
		}
		p = b
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		return Profile{}, err
	}
	p.Base = ""
	if err := p.Validate(); err != nil {
		return Profile{}, err
	}
	return p, nil
}

// KnobNames lists the engine arguments Set accepts, as vLLM's flags name them.
func KnobNames() []string {
	return []string{
		"max-num-seqs", "max-num-batched-tokens", "enable-chunked-prefill", "enable-prefix-caching",
		"gpu-memory-utilization", "max-model-len", "kv-cache-dtype", "tensor-parallel-size",
		"quantization", "block-size", "num-gpu-blocks-override",
		"enable-lora", "max-loras", "max-cpu-loras", "max-lora-rank",
	}
}

// Set changes one engine argument by its vLLM name: "max-num-seqs",
// "--max-num-seqs" and "max_num_seqs" are the same knob. Booleans take
// true/false; "no-enable-prefix-caching" (vLLM's negative form) sets false.
// The profile is not revalidated; call Validate after the last Set.
func (p *Profile) Set(name, value string) error {
	n := strings.ReplaceAll(strings.TrimLeft(name, "-"), "_", "-")
	if neg, ok := strings.CutPrefix(n, "no-"); ok {
		n, value = neg, "false"
	}
	e := &p.Engine
	var err error
	switch n {
	case "max-num-seqs":
		e.MaxNumSeqs, err = strconv.Atoi(value)
	case "max-num-batched-tokens":
		e.MaxNumBatchedTokens, err = strconv.Atoi(value)
	case "enable-chunked-prefill":
		e.EnableChunkedPrefill, err = parseBool(value)
	case "enable-prefix-caching":
		e.EnablePrefixCaching, err = parseBool(value)
	case "gpu-memory-utilization":
		e.GPUMemoryUtilization, err = strconv.ParseFloat(value, 64)
	case "max-model-len":
		e.MaxModelLen, err = parseTokens(value)
	case "kv-cache-dtype":
		e.KVCacheDtype = value
	case "tensor-parallel-size":
		e.TensorParallelSize, err = strconv.Atoi(value)
	case "quantization":
		e.Quantization = value
	case "block-size":
		e.BlockSize, err = strconv.Atoi(value)
	case "num-gpu-blocks-override":
		e.NumGPUBlocksOverride, err = strconv.Atoi(value)
	case "enable-lora":
		e.EnableLoRA, err = parseBool(value)
	case "max-loras":
		e.MaxLoRAs, err = strconv.Atoi(value)
	case "max-cpu-loras":
		e.MaxCPULoRAs, err = strconv.Atoi(value)
	case "max-lora-rank":
		e.MaxLoRARank, err = strconv.Atoi(value)
	default:
		return fmt.Errorf("sim: unknown engine argument %q (known: %s)", name, strings.Join(KnobNames(), ", "))
	}
	if err != nil {
		return fmt.Errorf("sim: --%s=%q: %w", n, value, err)
	}
	return nil
}

func parseBool(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "", "true", "1", "yes", "on":
		return true, nil
	case "false", "0", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("not a boolean")
}

// parseTokens accepts vLLM's max-model-len forms: 32768, 32k, 1m.
func parseTokens(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(strings.ToLower(s), "k"):
		mult, s = 1024, s[:len(s)-1]
	case strings.HasSuffix(strings.ToLower(s), "m"):
		mult, s = 1024*1024, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	return n * mult, err
}

// quantBytes is the weight storage per parameter under vLLM's quantization
// methods (4-bit methods carry group scales: ≈4.5 bits).
func quantBytes(method string) (float64, bool) {
	switch method {
	case "fp8", "fbgemm_fp8", "modelopt", "compressed-tensors", "int8", "w8a8", "experts_int8":
		return 1, true
	case "awq", "awq_marlin", "gptq", "gptq_marlin", "bitsandbytes", "gguf", "int4", "mxfp4", "nvfp4":
		return 0.5625, true
	}
	return 0, false
}

// kvDtypeScale is the KV size under kv_cache_dtype relative to 16-bit.
func kvDtypeScale(dtype string) (float64, bool) {
	switch dtype {
	case "", "auto", "bfloat16", "float16", "half":
		return 1, true
	case "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc":
		return 0.5, true
	}
	return 0, false
}

const gib = 1 << 30

// derived holds the numbers every other part computes from a profile. It is
// computed once per replica by derive.
type derived struct {
	tp                 int
	blockSize          int
	numGPUBlocks       int
	maxModelLen        int
	bytesPerParam      float64
	weightBytes        float64 // whole model
	kvBytesPerToken    float64 // whole model, after kv_cache_dtype
	kvBytesAvailPerGPU float64
	lora               loraDerived // zero without enable_lora
}

func (p Profile) derive() (derived, error) {
	e := p.Engine
	d := derived{tp: max(e.TensorParallelSize, 1), blockSize: e.BlockSize, maxModelLen: e.MaxModelLen}
	if d.blockSize == 0 {
		d.blockSize = 16
	}
	if d.maxModelLen == 0 {
		d.maxModelLen = p.Model.MaxModelLen
	}
	var errs []error
	d.bytesPerParam = p.Model.BytesPerParam
	if d.bytesPerParam == 0 {
		d.bytesPerParam = 2
	}
	if q := strings.ToLower(e.Quantization); q != "" && q != "none" {
		b, ok := quantBytes(q)
		if !ok {
			errs = append(errs, fmt.Errorf("quantization %q unknown", e.Quantization))
		}
		d.bytesPerParam = b
	}
	scale, ok := kvDtypeScale(strings.ToLower(e.KVCacheDtype))
	if !ok {
		errs = append(errs, fmt.Errorf("kv_cache_dtype %q unknown", e.KVCacheDtype))
	}
	d.weightBytes = p.Model.ParamsBillion * 1e9 * d.bytesPerParam
	d.kvBytesPerToken = p.Model.KVBytesPerToken * scale
	d.kvBytesAvailPerGPU = p.Hardware.MemoryGiB*gib*e.GPUMemoryUtilization - d.weightBytes/float64(d.tp) -
		p.Overheads.ActivationReserveGiB*gib
	if e.EnableLoRA {
		// vLLM preallocates every GPU slot at max_lora_rank before it
		// sizes the KV cache, so the slots come out of the KV blocks.
		d.lora = deriveLoRA(p)
		d.kvBytesAvailPerGPU -= float64(d.lora.maxLoRAs) * d.lora.adapterBytes / float64(d.tp)
	}
	if e.NumGPUBlocksOverride > 0 {
		d.numGPUBlocks = e.NumGPUBlocksOverride
	} else if d.kvBytesPerToken > 0 && d.blockSize > 0 {
		perBlockPerGPU := d.kvBytesPerToken / float64(d.tp) * float64(d.blockSize)
		d.numGPUBlocks = int(d.kvBytesAvailPerGPU / perBlockPerGPU)
	}
	return d, errors.Join(errs...)
}

// NumGPUBlocks is the KV cache capacity in blocks, as vLLM derives it from
// memory (or num_gpu_blocks_override). 0 when the profile is invalid.
func (p Profile) NumGPUBlocks() int {
	d, err := p.derive()
	if err != nil {
		return 0
	}
	return d.numGPUBlocks
}

// Validate reports every problem with the profile at once.
func (p Profile) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	h, m, e, o := p.Hardware, p.Model, p.Engine, p.Overheads
	if p.Name == "" {
		bad("name is empty")
	}
	if h.MemoryGiB <= 0 || h.MemoryBandwidthGBps <= 0 || h.BF16TFLOPS <= 0 {
		bad("hardware: memory_gib, memory_bandwidth_gbps and bf16_tflops must be > 0")
	}
	if h.BandwidthEfficiency <= 0 || h.BandwidthEfficiency > 1 || h.ComputeEfficiency <= 0 || h.ComputeEfficiency > 1 {
		bad("hardware: bandwidth_efficiency and compute_efficiency must be in (0,1]")
	}
	if m.Name == "" || m.ParamsBillion <= 0 || m.KVBytesPerToken <= 0 || m.MaxModelLen <= 0 {
		bad("model: name, params_billion, kv_bytes_per_token and max_model_len are required")
	}
	if m.OutputLen.Median <= 0 || m.OutputLen.Sigma < 0 {
		bad("model: output_len.median must be > 0 and sigma >= 0")
	}
	if e.MaxNumSeqs <= 0 || e.MaxNumBatchedTokens <= 0 {
		bad("engine: max_num_seqs and max_num_batched_tokens must be > 0")
	}
	if e.GPUMemoryUtilization <= 0 || e.GPUMemoryUtilization > 1 {
		bad("engine: gpu_memory_utilization must be in (0,1]")
	}
	if e.TensorParallelSize < 0 || e.BlockSize < 0 || e.NumGPUBlocksOverride < 0 || e.MaxModelLen < 0 {
		bad("engine: tensor_parallel_size, block_size, num_gpu_blocks_override, max_model_len must be >= 0")
	}
	if e.TensorParallelSize > 1 && (m.NumLayers <= 0 || m.HiddenSize <= 0) {
		bad("engine: tensor_parallel_size > 1 needs model.num_layers and model.hidden_size")
	}
	if o.Step < 0 || o.PerSeq < 0 || o.API < 0 || o.APIPerPromptToken < 0 || o.ActivationReserveGiB < 0 {
		bad("overheads must be >= 0")
	}
	errs = append(errs, p.validateLoRA()...)
	d, err := p.derive()
	if err != nil {
		errs = append(errs, err)
	}
	if e.MaxModelLen > m.MaxModelLen && m.MaxModelLen > 0 {
		bad("engine: max_model_len %d exceeds the model's %d", e.MaxModelLen, m.MaxModelLen)
	}
	if d.numGPUBlocks <= 0 && err == nil && len(errs) == 0 {
		bad("no memory left for the KV cache: weights %.1f GiB per GPU, %.1f GiB usable",
			d.weightBytes/float64(d.tp)/gib, h.MemoryGiB*e.GPUMemoryUtilization)
	} else if d.numGPUBlocks*d.blockSize < d.maxModelLen && len(errs) == 0 {
		bad("max_model_len %d is larger than the KV cache (%d tokens); lower max_model_len or raise gpu_memory_utilization",
			d.maxModelLen, d.numGPUBlocks*d.blockSize)
	}
	if !e.EnableChunkedPrefill && e.MaxNumBatchedTokens < d.maxModelLen && len(errs) == 0 {
		bad("engine: without chunked prefill max_num_batched_tokens (%d) must be >= max_model_len (%d)",
			e.MaxNumBatchedTokens, d.maxModelLen)
	}
	if len(errs) > 0 {
		return fmt.Errorf("sim: profile %q: %w", p.Name, errors.Join(errs...))
	}
	return nil
}
