package bench

import (
	"math"
	"slices"
	"time"
)

// Dist summarises one metric the way vllm bench does: numpy's mean, median,
// population standard deviation and percentiles with linear interpolation,
// all in milliseconds. An empty sample gives all zeros, as vllm's
// np.mean(x or 0) does.
type Dist struct {
	Count             int
	Mean, Median, Std float64
	Percentiles       []Percentile
	Min, Max          float64
	sorted            []float64
}

// Percentile is one requested percentile: P in [0, 100], Value in ms.
type Percentile struct {
	P, Value float64
}

// At returns the value of percentile p if it was requested, else computes
// it from the sample.
func (d Dist) At(p float64) float64 {
	for _, q := range d.Percentiles {
		if q.P == p {
			return q.Value
		}
	}
	return percentileSorted(d.sorted, p)
}

// newDist summarises xs (milliseconds); it sorts xs in place.
func newDist(xs []float64, ps []float64) Dist {
	slices.Sort(xs)
	d := Dist{Count: len(xs), sorted: xs}
	if len(xs) > 0 {
		d.Min, d.Max = xs[0], xs[len(xs)-1]
		var sum float64
		for _, x := range xs {
			sum += x
		}
		d.Mean = sum / float64(len(xs))
		var ss float64
		for _, x := range xs {
			ss += (x - d.Mean) * (x - d.Mean)
		}
		d.Std = math.Sqrt(ss / float64(len(xs)))
	}
	d.Median = percentileSorted(xs, 50)
	for _, p := range ps {
		d.Percentiles = append(d.Percentiles, Percentile{P: p, Value: percentileSorted(xs, p)})
	}
	return d
}

// percentileSorted is numpy.percentile's default ("linear") method on
// sorted data: the value at rank p/100·(n−1), interpolating between the two
// nearest samples. Empty data gives 0.
func percentileSorted(xs []float64, p float64) float64 {
	n := len(xs)
	if n == 0 {
		return 0
	}
	h := p / 100 * float64(n-1)
	lo := int(math.Floor(h))
	if lo < 0 {
		return xs[0]
	}
	if lo >= n-1 {
		return xs[n-1]
	}
	return xs[lo] + (h-float64(lo))*(xs[lo+1]-xs[lo])
}

// ms converts a duration to float milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
