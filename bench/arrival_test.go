package bench

import (
	"math"
	"testing"
	"time"
)

func TestArrivalsRateAndBurstiness(t *testing.T) {
	const n = 20000
	const rate = 50.0
	tests := []struct {
		name       string
		burstiness float64
		wantCV     float64 // of inter-arrival gaps: 1/sqrt(shape)
	}{
		{"bursty 0.5", 0.5, math.Sqrt2},
		{"poisson 1", 1, 1},
		{"smooth 2", 2, 1 / math.Sqrt2},
		{"regular inf", math.Inf(1), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			offs := Arrivals(n, rate, tt.burstiness, newRand(42))
			if len(offs) != n {
				t.Fatalf("%d offsets", len(offs))
			}
			// vllm rescales so the last request goes out at n/rate.
			if got, want := offs[n-1], time.Duration(n/rate*float64(time.Second)); absDur(got-want) > time.Millisecond {
				t.Fatalf("last offset %v, want %v", got, want)
			}
			gaps := make([]float64, n)
			prev := time.Duration(0)
			for i, o := range offs {
				if o < prev {
					t.Fatalf("offset %d went backwards", i)
				}
				gaps[i] = (o - prev).Seconds()
				prev = o
			}
			m, sd := meanStd(gaps)
			if math.Abs(m*rate-1) > 0.01 {
				t.Errorf("mean gap %.5fs, want %.5fs", m, 1/rate)
			}
			// Sample CV of 20k gamma draws: standard error ≈ 1–2%; allow 5%.
			if cv := sd / m; math.Abs(cv-tt.wantCV) > 0.05*math.Max(tt.wantCV, 0.2) {
				t.Errorf("CV %.3f, want %.3f", cv, tt.wantCV)
			}
		})
	}
}

func TestArrivalsAllAtOnce(t *testing.T) {
	for _, rate := range []float64{0, math.Inf(1)} {
		for i, o := range Arrivals(10, rate, 1, newRand(1)) {
			if o != 0 {
				t.Fatalf("rate %v: offset %d = %v, want 0", rate, i, o)
			}
		}
	}
	if a := Arrivals(0, 10, 1, newRand(1)); len(a) != 0 {
		t.Fatalf("n=0 gave %v", a)
	}
}

func TestArrivalsDeterministic(t *testing.T) {
	a := Arrivals(100, 10, 0.7, newRand(9))
	b := Arrivals(100, 10, 0.7, newRand(9))
	c := Arrivals(100, 10, 0.7, newRand(10))
	same := true
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed differs at %d", i)
		}
		same = same && a[i] == c[i]
	}
	if same {
		t.Fatal("different seeds gave identical schedules")
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func meanStd(xs []float64) (float64, float64) {
	var s float64
	for _, x := range xs {
		s += x
	}
	m := s / float64(len(xs))
	var v float64
	for _, x := range xs {
		v += (x - m) * (x - m)
	}
	return m, math.Sqrt(v / float64(len(xs)))
}
