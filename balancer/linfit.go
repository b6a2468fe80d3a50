package balancer

import (
	"math"
	"sync"
	"sync/atomic"
)

// linFit learns y ≈ A + B·x online by least squares with exponential
// forgetting, so the fit follows a replica whose speed changes (a newer
// sample weighs 1, one n samples old λⁿ). Observations take a small mutex;
// the coefficients are published as atomics so predictions (the pickers'
// hot path) read them without locking. The zero value has no fit yet:
// Coeffs reports ok = false until the first observation.
type linFit struct {
	mu                  sync.Mutex
	w, sx, sy, sxx, sxy float64 // decayed sums of 1, x, y, x², xy (under mu)
	a, b                atomic.Uint64
	n                   atomic.Int64 // observations so far
}

// fitForget is λ: the weight left to the previous samples at each new one
// (an effective window of about 1/(1−λ) = 40 requests), so a replica that
// slows down is re-learned within a few dozen of its requests.
const fitForget = 0.975

// observe adds one sample. x ≥ 0, y ≥ 0 are expected; others are ignored.
func (f *linFit) observe(x, y float64) { f.observeWith(x, y, solveFit) }

// observeWith adds one sample and refits with solve.
func (f *linFit) observeWith(x, y float64, solve func(w, sx, sy, sxx, sxy float64) (a, b float64)) {
	if !(x >= 0) || !(y >= 0) || math.IsInf(x, 0) || math.IsInf(y, 0) {
		return
	}
	f.mu.Lock()
	f.w = f.w*fitForget + 1
	f.sx = f.sx*fitForget + x
	f.sy = f.sy*fitForget + y
	f.sxx = f.sxx*fitForget + x*x
	f.sxy = f.sxy*fitForget + x*y
	a, b := solve(f.w, f.sx, f.sy, f.sxx, f.sxy)
	f.a.Store(math.Float64bits(a))
	f.b.Store(math.Float64bits(b))
	f.mu.Unlock()
	f.n.Add(1)
}

// solveFit is the weighted least-squares line through the sums, kept
// physical: a non-negative slope (more work never takes less time) and an
// intercept (a fixed cost) that is non-negative and at most half the mean
// y — a few samples at similar x must not pass the whole cost off as fixed
// and leave a slope that makes a slow replica look fast. Until there are
// fitMinSamples, or when x barely varies, or when the intercept comes out
// unphysical, the line goes through the origin: a pure rate, Σxy/Σx².
func solveFit(w, sx, sy, sxx, sxy float64) (a, b float64) {
	mx, my := sx/w, sy/w
	varx := sxx/w - mx*mx
	if w >= fitMinSamples && varx > 1e-6*mx*mx {
		b = (sxy/w - mx*my) / varx
		a = my - b*mx
	}
	if !(b > 0) || a < 0 || a > my/2 {
		a, b = 0, 0
		if sxx > 0 {
			b = sxy / sxx
		}
	}
	return a, max(b, 0)
}

// stepFit is a linFit for a decode step's time against the batch it
// decodes in: there the fixed cost is most of the time (every step reads
// all the weights; each sequence in the batch adds little), so the fit may
// put all of it in the intercept, and where it cannot tell a slope (too
// few samples, batches of one size, a slope that comes out falling) it is
// the mean step, not a line through the origin — which at a batch smaller
// than its samples' would predict a fraction of the floor every step
// pays. The zero value has no fit yet.
type stepFit struct{ linFit }

// observe adds one sample (x the batch, y the seconds per step).
func (f *stepFit) observe(x, y float64) { f.observeWith(x, y, solveStepFit) }

// solveStepFit is solveFit for stepFit: a least-squares line with a
// non-negative slope and intercept, else the mean.
func solveStepFit(w, sx, sy, sxx, sxy float64) (a, b float64) {
	mx, my := sx/w, sy/w
	varx := sxx/w - mx*mx
	if w < fitMinSamples || !(varx > 1e-6*mx*mx) {
		return my, 0
	}
	b = (sxy/w - mx*my) / varx
	a = my - b*mx
	switch {
	case !(b > 0):
		return my, 0
	case a < 0:
		return 0, sxy / sxx
	}
	return a, b
}

// fitMinSamples is how many (decayed) samples a fit needs before it
// separates a fixed cost from the rate.
const fitMinSamples = 10

// rate is the samples' mean x over mean y (Σx/Σy; for the TTFT fit,
// prompt tokens per second of TTFT): the replica's measured speed, robust
// to how the line splits it into fixed cost and slope. 0 before any sample.
func (f *linFit) rate() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sy <= 0 {
		return 0
	}
	return f.sx / f.sy
}

// coeffs returns the current fit; ok is false before any observation.
func (f *linFit) coeffs() (a, b float64, ok bool) {
	if f.n.Load() == 0 {
		return 0, 0, false
	}
	return math.Float64frombits(f.a.Load()), math.Float64frombits(f.b.Load()), true
}
