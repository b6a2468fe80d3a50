package bench

import (
	"errors"
	"math"
	"testing"
)

// normalSample draws n values from N(mean, sd) with a fixed seed.
func normalSample(seed uint64, n int, mean, sd float64) []float64 {
	rng := newRand(seed)
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = mean + sd*rng.NormFloat64()
	}
	return xs
}

func TestBootstrapDiff(t *testing.T) {
	tests := []struct {
		name     string
		a, b     []float64
		p        float64
		wantSig  bool
		deltaMin float64 // the point estimate is at least this (when wantSig)
	}{
		{"same distribution, median", normalSample(1, 400, 100, 10), normalSample(2, 400, 100, 10), 50, false, 0},
		{"same distribution, P99", normalSample(3, 400, 100, 10), normalSample(4, 400, 100, 10), 99, false, 0},
		{"same distribution, unpaired sizes", normalSample(5, 300, 100, 10), normalSample(6, 500, 100, 10), 50, false, 0},
		{"shifted by 30, median", normalSample(7, 400, 100, 10), normalSample(8, 400, 130, 10), 50, true, 25},
		{"shifted by 30, P99", normalSample(9, 400, 100, 10), normalSample(10, 400, 130, 10), 99, true, 15},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ci, err := BootstrapDiff(tt.a, tt.b, PercentileStatistic(tt.p), BootstrapOptions{Seed: 42})
			if err != nil {
				t.Fatal(err)
			}
			if ci.Resamples != 1000 || ci.Level != 0.95 {
				t.Fatalf("defaults not applied: %+v", ci)
			}
			if !(ci.Lower <= ci.Delta && ci.Delta <= ci.Upper) && tt.p == 50 {
				t.Errorf("point estimate %v outside its interval [%v, %v]", ci.Delta, ci.Lower, ci.Upper)
			}
			if got := ci.Significant(); got != tt.wantSig {
				t.Fatalf("significant = %v, want %v (CI [%v, %v], delta %v)", got, tt.wantSig, ci.Lower, ci.Upper, ci.Delta)
			}
			if !tt.wantSig && !(ci.Lower <= 0 && 0 <= ci.Upper) {
				t.Fatalf("CI [%v, %v] excludes 0", ci.Lower, ci.Upper)
			}
			if tt.wantSig && (ci.Lower <= 0 || ci.Delta < tt.deltaMin) {
				t.Fatalf("CI [%v, %v], delta %v: want a positive shift ≥ %v", ci.Lower, ci.Upper, ci.Delta, tt.deltaMin)
			}
			again, _ := BootstrapDiff(tt.a, tt.b, PercentileStatistic(tt.p), BootstrapOptions{Seed: 42})
			if again != ci {
				t.Fatalf("same seed, different interval: %+v vs %+v", again, ci)
			}
		})
	}
}

func TestBootstrapDiffNegativeShiftAndMissing(t *testing.T) {
	a, b := normalSample(11, 200, 100, 5), normalSample(12, 200, 60, 5)
	for i := 0; i < len(a); i += 10 {
		a[i], b[i+1] = math.NaN(), math.NaN() // failed requests on either side
	}
	ci, err := BootstrapDiff(a, b, PercentileStatistic(50), BootstrapOptions{Seed: 1, Resamples: 300, Level: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	if !ci.Significant() || ci.Upper >= 0 || ci.Resamples != 300 || ci.Level != 0.9 {
		t.Fatalf("want a significant drop: %+v", ci)
	}
}

func TestBootstrapDiffErrors(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name string
		a, b []float64
		o    BootstrapOptions
	}{
		{"empty side", []float64{1, 2}, nil, BootstrapOptions{}},
		{"only NaN", []float64{1, 2}, []float64{nan, nan}, BootstrapOptions{}},
		{"bad level", []float64{1}, []float64{1}, BootstrapOptions{Level: 1.5}},
		{"negative resamples", []float64{1}, []float64{1}, BootstrapOptions{Resamples: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := BootstrapDiff(tt.a, tt.b, PercentileStatistic(50), tt.o); !errors.Is(err, ErrBootstrap) {
				t.Fatalf("err = %v, want ErrBootstrap", err)
			}
		})
	}
}
