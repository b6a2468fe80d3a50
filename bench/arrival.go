package bench

import (
	"math"
	"math/rand/v2"
	"time"
)

// Arrivals returns n send offsets from the start of a run, the way vllm
// bench schedules requests: inter-arrival gaps drawn from a gamma
// distribution with shape = burstiness and mean 1/rate (burstiness 1 is a
// Poisson process, < 1 burstier, > 1 more regular, +Inf perfectly regular),
// summed, then rescaled so the last request goes out at n/rate seconds, as
// vllm does to take seed-to-seed noise out of the achieved rate. The first
// request also waits one gap.
//
// rate 0 or +Inf sends everything at once (all offsets 0). burstiness 0
// means 1. rng is the only source of randomness.
func Arrivals(n int, rate, burstiness float64, rng *rand.Rand) []time.Duration {
	out := make([]time.Duration, n)
	if n == 0 || rate <= 0 || math.IsInf(rate, 1) {
		return out
	}
	if burstiness == 0 {
		burstiness = 1
	}
	cum := make([]float64, n)
	var t float64
	for i := range cum {
		if math.IsInf(burstiness, 1) {
			t += 1 / rate
		} else {
			t += gamma(rng, burstiness, 1/(rate*burstiness))
		}
		cum[i] = t
	}
	scale := 1.0
	if t > 0 {
		scale = float64(n) / rate / t
	}
	for i, c := range cum {
		out[i] = time.Duration(c * scale * float64(time.Second))
	}
	return out
}

// gamma draws from Gamma(shape, scale) with Marsaglia and Tsang's method
// (ACM TOMS 26(3), 2000); shapes below 1 use the boost
// Gamma(a) = Gamma(a+1)·U^(1/a).
func gamma(rng *rand.Rand, shape, scale float64) float64 {
	if shape < 1 {
		u := rng.Float64()
		for u == 0 {
			u = rng.Float64()
		}
		return gamma(rng, shape+1, scale) * math.Pow(u, 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		var x, v float64
		for v <= 0 {
			x = rng.NormFloat64()
			v = 1 + c*x
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x {
			return d * v * scale
		}
		if u > 0 && math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v * scale
		}
	}
}
