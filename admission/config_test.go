package admission

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := Config{}.WithDefaults()
	if c.MaxQueueRequests != DefaultMaxQueueRequests || c.MaxQueueTokens != DefaultMaxQueueTokens ||
		c.AgingBound != DefaultAgingBound || c.Classes != DefaultClasses || c.MaxUnplaced != DefaultMaxUnplaced ||
		c.RecheckInterval != DefaultRecheckInterval || c.Estimate.OutputQuantile != DefaultOutputQuantile ||
		c.Saturation.KVUsageThreshold != DefaultKVUsageThreshold || c.MaxRetryAfter != DefaultMaxRetryAfter {
		t.Fatalf("defaults not filled: %+v", c)
	}
	// Explicit values and "off" sentinels survive.
	c = Config{MaxQueueRequests: -1, AgingBound: -1, Classes: 2}.WithDefaults()
	if c.MaxQueueRequests != -1 || c.AgingBound != -1 || c.Classes != 2 {
		t.Fatalf("explicit values overwritten: %+v", c)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero Config invalid: %v", err)
	}
}

func TestConfigValidateReportsEveryError(t *testing.T) {
	t.Parallel()
	c := Config{
		Classes:          MaxClasses + 1,
		TenantQueueShare: 1.5,
		DefaultTimeout:   -time.Second,
		MaxInFlight:      -1,
		DrainAlpha:       math.NaN(),
		InitialDrainRate: math.Inf(1),
		Estimate:         EstimateConfig{OutputQuantile: 1},
		Saturation:       SaturationConfig{KVUsageThreshold: 2},
		Lanes:            LaneConfig{LongPromptTokens: -1},
	}
	err := c.Validate()
	for _, field := range []string{"Classes", "TenantQueueShare", "DefaultTimeout", "MaxInFlight", "DrainAlpha",
		"InitialDrainRate", "OutputQuantile", "KVUsageThreshold", "LongPromptTokens"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate does not name %s: %v", field, err)
		}
	}
	if _, err := New("m", c, Deps{}); err == nil {
		t.Fatal("New accepted an invalid config")
	}
}

func TestMetricsRegistration(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Fatal("registering twice should fail")
	}
	// Two pools share one Metrics.
	a, _ := New("a", Config{}, Deps{Metrics: m})
	b, _ := New("b", Config{MaxInFlight: 1, MaxQueueRequests: -1}, Deps{Metrics: m})
	tk, _ := a.Admit(t.Context(), tok(1, 0))
	tk.ReleaseUsage(Usage{PromptTokens: 2, CompletionTokens: 3})
	tk, _ = b.Admit(t.Context(), tok(1, 0))
	if _, err := b.Admit(t.Context(), tok(1, 0)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("err = %v", err)
	}
	tk.Release()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "gpurouter_admission_") {
			t.Errorf("metric %s lacks the gpurouter_admission_ prefix", mf.GetName())
		}
		names[mf.GetName()] = true
	}
	for _, want := range []string{"gpurouter_admission_queue_depth", "gpurouter_admission_wait_seconds",
		"gpurouter_admission_admitted_total", "gpurouter_admission_shed_total", "gpurouter_admission_estimate_ratio",
		"gpurouter_admission_prompt_correction_ratio", "gpurouter_admission_drain_rate_tokens_per_second"} {
		if !names[want] {
			t.Errorf("missing %s", want)
		}
	}
}
