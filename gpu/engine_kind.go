package gpu

import "fmt"

// Engine names the inference engine behind a replica's /metrics, that is,
// which metric families hold its load signals. Configuration names one per
// pool (or leaves it empty); the scraper reports the one it found in
// EngineStats.Engine. The zero value, EngineAuto, means "detect it".
type Engine string

// The engines whose /metrics the scraper reads, and the two special values.
const (
	// EngineAuto detects the engine in every scrape from the first metric
	// family with a known prefix (vllm:, sglang:, llamacpp:, tgi_).
	EngineAuto Engine = ""
	// EngineVLLM reads vllm:num_requests_{running,waiting},
	// vllm:kv_cache_usage_perc (or gpu_cache_usage_perc) and the rest.
	EngineVLLM Engine = "vllm"
	// EngineSGLang reads sglang:num_running_reqs, sglang:num_queue_reqs,
	// sglang:token_usage and sglang:max_total_num_tokens.
	EngineSGLang Engine = "sglang"
	// EngineLlamaCpp reads llama-server --metrics: llamacpp:requests_processing,
	// llamacpp:requests_deferred, and llamacpp:kv_cache_usage_ratio where the
	// build still has it.
	EngineLlamaCpp Engine = "llamacpp"
	// EngineTGI reads Hugging Face text-generation-inference:
	// tgi_batch_current_size and tgi_queue_size.
	EngineTGI Engine = "tgi"
	// EngineNone means no engine scrape at all: the router routes the
	// replica on its own counts. NewEngineSource returns no source for it.
	EngineNone Engine = "none"
)

// ParseEngine reads an engine name as configuration spells it: "vllm",
// "sglang", "llamacpp", "tgi", "none", or "" / "auto" for EngineAuto.
// Anything else is an error that lists the accepted names.
func ParseEngine(s string) (Engine, error) {
	switch e := Engine(s); e {
	case EngineAuto, EngineVLLM, EngineSGLang, EngineLlamaCpp, EngineTGI, EngineNone:
		return e, nil
	case "auto":
		return EngineAuto, nil
	}
	return "", fmt.Errorf("gpu: unknown engine %q (want vllm, sglang, llamacpp, tgi, none or auto)", s)
}

// String is the configuration spelling; EngineAuto prints as "auto".
func (e Engine) String() string {
	if e == EngineAuto {
		return "auto"
	}
	return string(e)
}

// prefix is the metric-name prefix of e's families; "" for the special values.
func (e Engine) prefix() string {
	switch e {
	case EngineVLLM:
		return "vllm:"
	case EngineSGLang:
		return "sglang:"
	case EngineLlamaCpp:
		return "llamacpp:"
	case EngineTGI:
		return "tgi_"
	}
	return ""
}

// engineOf is the engine whose prefix starts the metric name, or EngineAuto
// when none does. The prefixes are disjoint, so the order of the checks
// does not matter.
func engineOf(name []byte) Engine {
	for _, e := range [...]Engine{EngineVLLM, EngineSGLang, EngineLlamaCpp, EngineTGI} {
		if p := e.prefix(); len(name) >= len(p) && string(name[:len(p)]) == p { // no allocation
			return e
		}
	}
	return EngineAuto
}
