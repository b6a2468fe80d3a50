package bench

import (
	"slices"
	"time"
)

// Request is one request a benchmark sends: what to ask for and, in a trace
// replay, when. The zero value is an empty prompt with no output length,
// which Run rejects.
type Request struct {
	// Prompt is the prompt text. Empty means the load generator synthesises
	// PromptTokens tokens from PromptSeed when it sends the request, so a
	// long trace costs memory per request, not per prompt token.
	Prompt string
	// PromptSeed seeds the synthesised prompt when Prompt is empty; distinct
	// seeds give prompts that share no prefix.
	PromptSeed uint64
	// PromptBlocks, when set (and Prompt empty), make the synthesised
	// prompt out of MooncakeBlockTokens-token blocks of text, one per id,
	// the same text for the same id, so requests that start with the same
	// ids share that prefix token for token (a Mooncake trace's hash_ids).
	PromptBlocks []uint64
	// PromptTokens is the prompt length in tokens (counted with
	// bench/tokens, or given by the trace).
	PromptTokens int
	// OutputTokens is the requested output length: max_tokens in the body.
	OutputTokens int
	// UseCase labels the request for per-use-case reports; empty means none.
	UseCase string
	// Model, when set, is the request's "model" instead of Config.Model:
	// a LoRA adapter (AdapterMix.Assign). Reports show latency per model.
	Model string
	// Arrival is the send offset from the start of the run; used only when
	// the Dataset is Timed.
	Arrival time.Duration
}

// Dataset is a named list of requests. The zero value is an empty dataset.
type Dataset struct {
	// Name is the dataset kind it was built from (random, sharegpt, …).
	Name string
	// Requests are in send order.
	Requests []Request
	// Timed is true when every Request carries its own Arrival (trace
	// replay); otherwise arrivals come from a rate and a burstiness.
	Timed bool
	// Dropped counts the requests left out because prompt plus output was
	// longer than DatasetConfig.MaxModelLen.
	Dropped int
}

// dropLongerThan removes the requests whose prompt plus output exceeds
// maxLen tokens, as vLLM refuses them, and counts them in Dropped.
// maxLen 0 keeps everything.
func (d *Dataset) dropLongerThan(maxLen int) {
	if maxLen <= 0 {
		return
	}
	n := len(d.Requests)
	d.Requests = slices.DeleteFunc(d.Requests, func(r Request) bool { return r.PromptTokens+r.OutputTokens > maxLen })
	d.Dropped += n - len(d.Requests)
}

// Arrivals returns the requests' own arrival offsets, for timed datasets.
func (d *Dataset) Arrivals() []time.Duration {
	out := make([]time.Duration, len(d.Requests))
	for i, r := range d.Requests {
		out[i] = r.Arrival
	}
	return out
}
