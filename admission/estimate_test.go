package admission

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestEstimateKnownStrings(t *testing.T) {
	t.Parallel()
	est := NewEstimator(EstimateConfig{})
	tests := []struct {
		name      string
		raw       int
		maxTokens int
		prompt    int
		output    int
	}{
		// Raw estimates as a counter would give them (bench/tokens' own
		// tests pin its counts); before any usage is observed the
		// estimator passes them through and fills in the output.
		{"hello world", 4, 0, 4, DefaultOutputTokens},
		{"tiktoken", 6, 16, 6, 16},
		{"long word", 6, 1, 6, 1},
		{"chat", 19, 0, 19, DefaultOutputTokens},
		{"empty", 0, 0, 0, DefaultOutputTokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := est.Cost(tt.raw, tt.maxTokens)
			if c.PromptTokens != tt.prompt || c.OutputTokens != tt.output {
				t.Fatalf("Cost(%d, %d) = prompt %d output %d, want %d %d", tt.raw, tt.maxTokens, c.PromptTokens, c.OutputTokens, tt.prompt, tt.output)
			}
			if c.Tokens() != max(int64(tt.prompt+tt.output), 1) {
				t.Fatalf("Tokens() = %d", c.Tokens())
			}
		})
	}
}

// TestPromptCorrectionConverges: the engine's tokenizer counts 18% more
// than the router's estimate plus a fixed 7-token template; the learned
// ratio converges to the size-weighted truth and corrected estimates land
// within a few percent.
func TestPromptCorrectionConverges(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	e := NewEstimator(EstimateConfig{})
	engine := func(raw int) int { return int(math.Round(1.18*float64(raw))) + 7 }
	relErr := func(raw int) float64 {
		c := e.Cost(raw, 0)
		return math.Abs(float64(c.PromptTokens)-float64(engine(raw))) / float64(engine(raw))
	}
	if before := relErr(1000); before < 0.15 {
		t.Fatalf("uncorrected error %.3f, expected ~0.18", before)
	}
	for range 300 {
		raw := 200 + rng.IntN(1800)
		e.Observe(e.Cost(raw, 0), Usage{PromptTokens: engine(raw)})
	}
	if r := e.Ratio(); math.Abs(r-1.18) > 0.03 {
		t.Fatalf("ratio %.3f, want ≈1.18 (+ template)", r)
	}
	for _, raw := range []int{500, 1000, 2000} {
		if got := relErr(raw); got > 0.03 {
			t.Errorf("corrected error at %d raw tokens: %.3f", raw, got)
		}
	}
	// Costs not built by the estimator, or without usage, teach nothing.
	r := e.Ratio()
	e.Observe(Cost{PromptTokens: 10}, Usage{PromptTokens: 1000})
	e.Observe(e.Cost(100, 0), Usage{})
	if e.Ratio() != r {
		t.Fatal("ratio moved on an unusable observation")
	}
}

func TestPromptCorrectionFollowsChange(t *testing.T) {
	t.Parallel()
	e := NewEstimator(EstimateConfig{PromptAlpha: 0.1})
	for range 100 {
		e.Observe(e.Cost(1000, 0), Usage{PromptTokens: 1000})
	}
	for range 60 { // the model behind the pool changed tokenizer
		e.Observe(e.Cost(1000, 0), Usage{PromptTokens: 1500})
	}
	if r := e.Ratio(); math.Abs(r-1.5) > 0.01 {
		t.Fatalf("ratio %.3f, want ≈1.5", r)
	}
}

func TestPromptCorrectionClamped(t *testing.T) {
	t.Parallel()
	e := NewEstimator(EstimateConfig{})
	e.Observe(e.Cost(10, 0), Usage{PromptTokens: 1_000_000})
	if r := e.Ratio(); r != maxPromptRatio {
		t.Fatalf("ratio %v, want clamp %v", r, maxPromptRatio)
	}
}

func TestExpectedOutputLearned(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	e := NewEstimator(EstimateConfig{MinOutputSamples: 50})
	for i := range 49 {
		e.Observe(e.Cost(100, 0), Usage{CompletionTokens: 100 + i})
	}
	if got := e.ExpectedOutput(); got != DefaultOutputTokens {
		t.Fatalf("expected output %d before MinOutputSamples, want the default", got)
	}
	// Completions uniform in [100, 300]: the median is 200.
	for range 2000 {
		e.Observe(e.Cost(100, 0), Usage{CompletionTokens: 100 + rng.IntN(201)})
	}
	if got := e.ExpectedOutput(); got < 185 || got > 215 {
		t.Fatalf("expected output %d, want ≈200", got)
	}
	// Completions of requests with max_tokens don't teach it.
	for range 2000 {
		e.Observe(e.Cost(100, 5), Usage{CompletionTokens: 5})
	}
	if got := e.ExpectedOutput(); got < 185 {
		t.Fatalf("expected output %d moved on max_tokens-limited requests", got)
	}
	// The distribution drifts: a window of ~1000 forgets the old one.
	for range 5000 {
		e.Observe(e.Cost(100, 0), Usage{CompletionTokens: 1000 + rng.IntN(1001)})
	}
	if got := e.ExpectedOutput(); got < 1400 || got > 1600 {
		t.Fatalf("expected output %d after drift, want ≈1500", got)
	}
}

func TestExpectedOutputQuantile(t *testing.T) {
	t.Parallel()
	e := NewEstimator(EstimateConfig{OutputQuantile: 0.9, MinOutputSamples: 1})
	for i := range 1000 {
		e.Observe(e.Cost(1, 0), Usage{CompletionTokens: 1 + i%100}) // uniform 1..100
	}
	if got := e.ExpectedOutput(); got < 84 || got > 96 {
		t.Fatalf("p90 %d, want ≈90", got)
	}
}

func TestOutputCappedByModelLength(t *testing.T) {
	t.Parallel()
	e := NewEstimator(EstimateConfig{MaxModelLen: 4096, DefaultOutputTokens: 1000})
	tests := []struct{ raw, maxTokens, want int }{
		{100, 0, 1000},
		{3500, 0, 596},
		{100, 8000, 3996},
		{5000, 0, 1}, // over the model's length: the engine will refuse it
	}
	for _, tt := range tests {
		if got := e.Cost(tt.raw, tt.maxTokens).OutputTokens; got != tt.want {
			t.Errorf("Cost(%d, %d).OutputTokens = %d, want %d", tt.raw, tt.maxTokens, got, tt.want)
		}
	}
}

func TestReleaseUsageTeachesThePool(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{}, Deps{})
	for range 50 {
		c := h.c.Estimate(1000, 0)
		tk, err := h.c.Admit(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		tk.ReleaseUsage(Usage{PromptTokens: 1250, CompletionTokens: 321})
	}
	s := h.c.Stats()
	if math.Abs(s.PromptCorrection-1.25) > 1e-9 || s.ExpectedOutput < 310 || s.ExpectedOutput > 330 {
		t.Fatalf("stats %+v", s)
	}
	if got := h.c.Estimate(1000, 0).PromptTokens; got != 1250 {
		t.Fatalf("corrected estimate %d, want 1250", got)
	}
	if got := metricValue(t, h.c.m.correction); got != 1.25 {
		t.Fatalf("correction gauge %v", got)
	}
}

func TestDecayingQuantileEdges(t *testing.T) {
	t.Parallel()
	q := newDecayingQuantile(10)
	if q.quantile(0.5) != 0 {
		t.Fatal("empty quantile not 0")
	}
	q.add(0)
	q.add(1)
	if got := q.quantile(0.5); got != 1 {
		t.Fatalf("quantile of {0,1} = %v", got)
	}
	for range 100000 { // long enough to renormalise
		q.add(1 << 30)
	}
	if got := q.quantile(0.5); math.IsInf(got, 0) || got < 1<<20 {
		t.Fatalf("quantile after overflow-prone run: %v", got)
	}
}
