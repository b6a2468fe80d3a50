package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrBootstrap is wrapped by every error about bootstrap inputs.
var ErrBootstrap = errors.New("bench: bootstrap")

// BootstrapOptions configures a bootstrap confidence interval. The zero
// value is 1,000 resamples, a 95% interval and seed 0.
type BootstrapOptions struct {
	// Resamples is B, the number of resamples; 0 means 1000.
	Resamples int
	// Level is the confidence level in (0, 1); 0 means 0.95.
	Level float64
	// Seed makes the resampling deterministic: equal inputs and seeds give
	// equal intervals.
	Seed uint64
}

func (o BootstrapOptions) withDefaults() BootstrapOptions {
	if o.Resamples == 0 {
		o.Resamples = 1000
	}
	if o.Level == 0 {
		o.Level = 0.95
	}
	return o
}

// Statistic reduces a sorted, non-empty sample to one number (a percentile,
// the mean). It must not modify the slice.
type Statistic func(sorted []float64) float64

// PercentileStatistic is numpy's linear percentile p (0–100), the same
// estimator the reports use, so a CI brackets the number printed beside it.
func PercentileStatistic(p float64) Statistic {
	return func(sorted []float64) float64 { return percentileSorted(sorted, p) }
}

// DiffCI is a statistic's difference between two samples, B − A, with its
// bootstrap percentile confidence interval.
type DiffCI struct {
	// A and B are the statistic on each full sample; Delta = B − A.
	A, B, Delta float64
	// Lower and Upper bound the interval at Level.
	Lower, Upper float64
	Level        float64
	// Resamples is the number of resamples whose statistic was defined on
	// both sides (a paired resample can draw no value for one side).
	Resamples int
}

// Significant reports whether the interval excludes 0: the difference is
// unlikely to be noise at the interval's level.
func (d DiffCI) Significant() bool {
	return d.Resamples > 0 && (d.Lower > 0 || d.Upper < 0)
}

// BootstrapDiff estimates stat(b) − stat(a) with a percentile bootstrap.
//
// Paired (len(a) == len(b), the same requests sent to both sides in the
// same order, as in an A/B run): each resample draws request indices with
// replacement and evaluates both sides on the same indices, so a request's
// length affects both sides alike and only the treatment shows. Otherwise
// each side is resampled on its own. NaN marks a request without a value
// (failed, or one output token for TPOT); it is skipped where it is drawn.
// The interval is the (1−Level)/2 and (1+Level)/2 quantiles of the B
// resampled differences.
func BootstrapDiff(a, b []float64, stat Statistic, o BootstrapOptions) (DiffCI, error) {
	o = o.withDefaults()
	if o.Resamples < 1 || !(o.Level > 0 && o.Level < 1) {
		return DiffCI{}, fmt.Errorf("%w: resamples %d, level %v: want ≥ 1 and in (0, 1)", ErrBootstrap, o.Resamples, o.Level)
	}
	sa, sb := finiteSorted(a), finiteSorted(b)
	if len(sa) == 0 || len(sb) == 0 {
		return DiffCI{}, fmt.Errorf("%w: a side has no values (%d and %d)", ErrBootstrap, len(sa), len(sb))
	}
	out := DiffCI{A: stat(sa), B: stat(sb), Level: o.Level}
	out.Delta = out.B - out.A
	rng := newRand(o.Seed)
	paired := len(a) == len(b)
	bufA, bufB := make([]float64, 0, len(a)), make([]float64, 0, len(b))
	diffs := make([]float64, 0, o.Resamples)
	for range o.Resamples {
		bufA, bufB = bufA[:0], bufB[:0]
		if paired {
			for range a {
				i := rng.IntN(len(a))
				bufA = appendFinite(bufA, a[i])
				bufB = appendFinite(bufB, b[i])
			}
		} else {
			for range a {
				bufA = appendFinite(bufA, a[rng.IntN(len(a))])
			}
			for range b {
				bufB = appendFinite(bufB, b[rng.IntN(len(b))])
			}
		}
		if len(bufA) == 0 || len(bufB) == 0 {
			continue
		}
		slices.Sort(bufA)
		slices.Sort(bufB)
		diffs = append(diffs, stat(bufB)-stat(bufA))
	}
	out.Resamples = len(diffs)
	if len(diffs) == 0 {
		return out, fmt.Errorf("%w: no resample had values on both sides", ErrBootstrap)
	}
	slices.Sort(diffs)
	alpha := (1 - o.Level) / 2
	out.Lower = percentileSorted(diffs, 100*alpha)
	out.Upper = percentileSorted(diffs, 100*(1-alpha))
	return out, nil
}

func appendFinite(xs []float64, x float64) []float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return xs
	}
	return append(xs, x)
}

// finiteSorted is a sorted copy of xs without NaN or infinite values.
func finiteSorted(xs []float64) []float64 {
	out := make([]float64, 0, len(xs))
	for _, x := range xs {
		out = appendFinite(out, x)
	}
	slices.Sort(out)
	return out
}
