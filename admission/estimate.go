package admission

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// Defaults for EstimateConfig's zero fields.
const (
	DefaultPromptAlpha      = 0.05
	DefaultOutputQuantile   = 0.5
	DefaultOutputTokens     = 256
	DefaultOutputWindow     = 1000 // observations
	DefaultMinOutputSamples = 20
)

// Bounds on the learned prompt correction: an engine's count is never 20×
// off a BPE estimate, so anything beyond is a reporting bug, not a ratio.
const (
	minPromptRatio = 0.05
	maxPromptRatio = 20
)

// EstimateConfig tunes one model's Estimator. The zero value means every
// default.
type EstimateConfig struct {
	// PromptAlpha is the EWMA weight of one request in the learned prompt
	// correction, in (0, 1] (default 0.05: about the last 20–40 requests).
	// The first requests are averaged plainly so it converges from the start.
	PromptAlpha float64
	// OutputQuantile is the quantile of observed completion lengths used as
	// the expected output of a request without max_tokens, in (0, 1)
	// (default 0.5).
	OutputQuantile float64
	// DefaultOutputTokens is the expected output before MinOutputSamples
	// completions have been observed (default 256).
	DefaultOutputTokens int
	// OutputWindow is roughly how many recent completions the learned
	// distribution remembers (default 1000).
	OutputWindow int
	// MinOutputSamples is how many completions are needed before the learned
	// distribution replaces DefaultOutputTokens (default 20).
	MinOutputSamples int
	// MaxModelLen is the model's context length in tokens (vLLM's
	// max_model_len): expected output never exceeds MaxModelLen − prompt.
	// 0 means unknown: no cap.
	MaxModelLen int
}

// WithDefaults returns e with every zero field set to its default.
func (e EstimateConfig) WithDefaults() EstimateConfig {
	if e.PromptAlpha == 0 {
		e.PromptAlpha = DefaultPromptAlpha
	}
	if e.OutputQuantile == 0 {
		e.OutputQuantile = DefaultOutputQuantile
	}
	if e.DefaultOutputTokens == 0 {
		e.DefaultOutputTokens = DefaultOutputTokens
	}
	if e.OutputWindow == 0 {
		e.OutputWindow = DefaultOutputWindow
	}
	if e.MinOutputSamples == 0 {
		e.MinOutputSamples = DefaultMinOutputSamples
	}
	return e
}

// Validate reports every invalid field.
func (e EstimateConfig) Validate() error {
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, fmt.Errorf("admission: Estimate.%s = %v: %s", field, v, want))
	}
	if !(e.PromptAlpha >= 0 && e.PromptAlpha <= 1) {
		bad("PromptAlpha", e.PromptAlpha, "must be in (0, 1] (0 for the default)")
	}
	if !(e.OutputQuantile >= 0 && e.OutputQuantile < 1) {
		bad("OutputQuantile", e.OutputQuantile, "must be in (0, 1) (0 for the default)")
	}
	if e.DefaultOutputTokens < 0 {
		bad("DefaultOutputTokens", e.DefaultOutputTokens, "must not be negative")
	}
	if e.OutputWindow < 0 {
		bad("OutputWindow", e.OutputWindow, "must not be negative")
	}
	if e.MinOutputSamples < 0 {
		bad("MinOutputSamples", e.MinOutputSamples, "must not be negative")
	}
	if e.MaxModelLen < 0 {
		bad("MaxModelLen", e.MaxModelLen, "must not be negative (0 for unknown)")
	}
	return errors.Join(errs...)
}

// Estimator turns the router's raw token estimates into a model's request
// Cost and learns, from the engine's reported usage, how to correct them:
// the ratio of engine prompt tokens to the router's estimate (an EWMA
// weighted by size), and the distribution of completion lengths of
// requests sent without max_tokens (a decaying running quantile).
//
// The raw estimate can come from anywhere — the router passes bytes/4 of
// the prompt; tests may pass a BPE count (bench/tokens) — since the
// correction is learned against the engine's own count. Cost reads
// lock-free; Observe takes the estimator's own lock. Safe for concurrent
// use. Build with NewEstimator; the zero value is not usable.
type Estimator struct {
	cfg EstimateConfig
	m   *poolMetrics // nil: no metrics

	// Published for lock-free reads by Cost.
	ratio    atomic.Uint64 // float64 bits: engine tokens per raw token
	expected atomic.Int64  // expected output tokens without max_tokens

	// mu guards the learning state below.
	mu          sync.Mutex
	promptN     int
	actualEWMA  float64 // EWMA of engine prompt tokens
	rawEWMA     float64 // EWMA of raw estimates
	completions decayingQuantile
}

// NewEstimator builds an estimator knowing nothing yet: correction 1,
// expected output cfg.DefaultOutputTokens. Zero fields take defaults;
// invalid values are the caller's to check with Validate.
func NewEstimator(cfg EstimateConfig) *Estimator {
	cfg = cfg.WithDefaults()
	e := &Estimator{cfg: cfg, completions: newDecayingQuantile(cfg.OutputWindow)}
	e.ratio.Store(math.Float64bits(1))
	e.expected.Store(int64(cfg.DefaultOutputTokens))
	return e
}

// Cost builds a request's cost from the router's raw prompt estimate (in
// tokens) and the client's max_tokens (0 when not given): the prompt
// corrected by the learned ratio, and max_tokens or the learned expected
// output, capped by the model's length. Class, Tenant and Deadline are
// left for the caller.
func (e *Estimator) Cost(rawPromptTokens, maxTokens int) Cost {
	c := e.PromptCost(rawPromptTokens)
	prompt := c.PromptTokens
	if maxTokens > 0 {
		c.OutputTokens = maxTokens
	} else {
		c.OutputTokens = int(e.expected.Load())
		c.learnOutput = true
	}
	if l := e.cfg.MaxModelLen; l > 0 {
		c.OutputTokens = min(c.OutputTokens, max(l-prompt, 1))
	}
	return c
}

// PromptCost is the cost of a request that generates nothing (an
// embedding): the corrected prompt and no output.
func (e *Estimator) PromptCost(rawPromptTokens int) Cost {
	raw := max(rawPromptTokens, 0)
	prompt := int(math.Round(float64(raw) * e.Ratio()))
	if raw > 0 {
		prompt = max(prompt, 1)
	}
	return Cost{PromptTokens: prompt, rawPrompt: int32(min(raw, math.MaxInt32))}
}

// Ratio is the learned correction: engine prompt tokens per raw token
// (1 until observed).
func (e *Estimator) Ratio() float64 { return math.Float64frombits(e.ratio.Load()) }

// ExpectedOutput is the expected completion length, in tokens, of a request
// without max_tokens (before any MaxModelLen cap).
func (e *Estimator) ExpectedOutput() int { return int(e.expected.Load()) }

// Observe learns from one finished request: c is the cost it was admitted
// with (from Cost), u the engine's usage. Only the prompt of a cost built
// by Cost teaches the correction, and only completions of requests without
// max_tokens teach the output distribution (a max_tokens-limited length
// says nothing about unlimited ones). Zero usage fields are skipped.
func (e *Estimator) Observe(c Cost, u Usage) {
	if e.m != nil {
		if u.PromptTokens > 0 && c.PromptTokens > 0 {
			e.m.promptErr.Observe(float64(c.PromptTokens) / float64(u.PromptTokens))
		}
		if u.CompletionTokens > 0 && c.OutputTokens > 0 {
			e.m.outputErr.Observe(float64(c.OutputTokens) / float64(u.CompletionTokens))
		}
	}
	learnPrompt := c.rawPrompt > 0 && u.PromptTokens > 0
	learnOutput := c.learnOutput && u.CompletionTokens > 0
	if !learnPrompt && !learnOutput {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if learnPrompt {
		e.promptN++
		a := max(e.cfg.PromptAlpha, 1/float64(e.promptN))
		e.actualEWMA += a * (float64(u.PromptTokens) - e.actualEWMA)
		e.rawEWMA += a * (float64(c.rawPrompt) - e.rawEWMA)
		r := min(max(e.actualEWMA/e.rawEWMA, minPromptRatio), maxPromptRatio)
		e.ratio.Store(math.Float64bits(r))
		if e.m != nil {
			e.m.correction.Set(r)
		}
	}
	if learnOutput {
		e.completions.add(u.CompletionTokens)
		if e.completions.n >= e.cfg.MinOutputSamples {
			x := max(int64(math.Round(e.completions.quantile(e.cfg.OutputQuantile))), 1)
			e.expected.Store(x)
			if e.m != nil {
				e.m.expectedOut.Set(float64(x))
			}
		}
	}
}
