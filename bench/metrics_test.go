package bench

import (
	"math"
	"testing"
	"time"
)

const msec = time.Millisecond

// timeline is a hand-built run whose metrics are worked out by hand below.
func timeline() *Result {
	return &Result{
		Duration: time.Second,
		Records: []Record{
			{ID: "r0", UseCase: "a", Sent: 0, TTFT: 100 * msec, ITLs: []time.Duration{10 * msec, 20 * msec, 30 * msec}, E2E: 160 * msec, End: 170 * msec, OutputTokens: 4, Chunks: 4, PromptTokens: 10, Lag: 1 * msec},
			{ID: "r1", UseCase: "b", Sent: 50 * msec, TTFT: 200 * msec, ITLs: []time.Duration{40 * msec}, E2E: 240 * msec, End: 300 * msec, OutputTokens: 2, Chunks: 2, PromptTokens: 20, Lag: 2 * msec},
			{ID: "r2", UseCase: "a", Sent: 60 * msec, TTFT: 50 * msec, E2E: 50 * msec, End: 110 * msec, OutputTokens: 1, Chunks: 1, PromptTokens: 5, Lag: 3 * msec, ClientQueue: 5 * msec},
			{ID: "r3", UseCase: "b", Sent: 70 * msec, End: 75 * msec, Status: 503, Reason: "http_503", Lag: 100 * msec},
		},
	}
}

func near(a, b float64) bool { return a == b || math.Abs(a-b) < 1e-9*math.Max(1, math.Abs(b)) }

func TestSummarizeHandBuiltTimeline(t *testing.T) {
	s := Summarize(timeline(), MetricOptions{Percentiles: []float64{50, 99}})
	if s.Completed != 3 || s.Failed != 1 || s.FailuresByReason["http_503"] != 1 {
		t.Fatalf("completed %d failed %d reasons %v", s.Completed, s.Failed, s.FailuresByReason)
	}
	if s.TotalInput != 35 || s.TotalOutput != 7 || !near(s.RequestThroughput, 3) || !near(s.OutputThroughput, 7) || !near(s.TotalTokenThroughput, 42) {
		t.Fatalf("totals %d/%d, throughputs %v %v %v", s.TotalInput, s.TotalOutput, s.RequestThroughput, s.OutputThroughput, s.TotalTokenThroughput)
	}
	tests := []struct {
		name                   string
		d                      Dist
		count                  int
		mean, median, std, p99 float64
	}{
		// TTFT [50 100 200]; p99 at rank 1.98: 100 + 0.98·100.
		{"ttft", s.TTFT, 3, 350.0 / 3, 100, math.Sqrt(35000.0 / 9), 198},
		// TPOT (160−100)/3 = 20 and (240−200)/1 = 40; the 1-token request has none.
		{"tpot", s.TPOT, 2, 30, 30, 10, 39.8},
		// ITL pooled [10 20 30 40].
		{"itl", s.ITL, 4, 25, 25, math.Sqrt(125), 39.7},
		// E2EL [50 160 240].
		{"e2el", s.E2EL, 3, 150, 160, math.Sqrt((100*100 + 10*10 + 90*90) / 3.0), 238.4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.d
			if d.Count != tt.count || !near(d.Mean, tt.mean) || !near(d.Median, tt.median) || !near(d.Std, tt.std) || !near(d.At(99), tt.p99) || !near(d.At(50), tt.median) {
				t.Fatalf("got n=%d mean %v median %v std %v p99 %v; want n=%d %v %v %v %v", d.Count, d.Mean, d.Median, d.Std, d.At(99), tt.count, tt.mean, tt.median, tt.std, tt.p99)
			}
		})
	}
	if s.MaxConcurrentRequests != 4 {
		t.Errorf("max concurrent %d, want 4 (all open at 70 ms)", s.MaxConcurrentRequests)
	}
	if s.MaxOutputTokensPerS != 7 {
		t.Errorf("peak tokens/s %v, want 7", s.MaxOutputTokensPerS)
	}
	// Lag over every request sent, failed ones too: [1 2 3 100], rank 2.97.
	if want := 3 + 0.97*97; !near(s.Lag.At(99), want) {
		t.Errorf("lag p99 %v, want %v", s.Lag.At(99), want)
	}
	// Shortest mean output first: b (2 tokens) before a (2.5).
	if len(s.UseCases) != 2 || s.UseCases[1].Name != "a" || s.UseCases[1].Completed != 2 || s.UseCases[0].Failed != 1 || !near(s.UseCases[1].P50, 105) || s.UseCases[1].MeanOutputTokens != 2.5 {
		t.Errorf("use cases %+v", s.UseCases)
	}
}

func TestGoodput(t *testing.T) {
	tests := []struct {
		name string
		slo  SLO
		good int
	}{
		{"none set", SLO{}, 0},
		{"ttft 150", SLO{TTFT: 150 * msec}, 2},
		{"ttft 150, tpot 30 (1-token TPOT counts as 0)", SLO{TTFT: 150 * msec, TPOT: 30 * msec}, 2},
		{"ttft 150, tpot 15", SLO{TTFT: 150 * msec, TPOT: 15 * msec}, 1},
		{"e2el 100", SLO{E2EL: 100 * msec}, 1},
		{"bound is inclusive", SLO{TTFT: 200 * msec}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Summarize(timeline(), MetricOptions{Goodput: tt.slo})
			if s.GoodRequests != tt.good || !near(s.RequestGoodput, float64(tt.good)) {
				t.Fatalf("good %d (%v/s), want %d", s.GoodRequests, s.RequestGoodput, tt.good)
			}
		})
	}
}

func TestPercentileMatchesNumpy(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	// numpy.percentile(range(1, 11), p) with the default linear method.
	for p, want := range map[float64]float64{0: 1, 25: 3.25, 50: 5.5, 90: 9.1, 99: 9.91, 99.9: 9.991, 100: 10} {
		if got := percentileSorted(xs, p); !near(got, want) {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if got := percentileSorted(nil, 99); got != 0 {
		t.Errorf("empty = %v, want 0", got)
	}
	if got := percentileSorted([]float64{7}, 99); got != 7 {
		t.Errorf("single = %v, want 7", got)
	}
}

func TestPeakTokensPerSecondBuckets(t *testing.T) {
	res := &Result{Duration: 3 * time.Second, Records: []Record{
		{Sent: 0, TTFT: 900 * msec, ITLs: []time.Duration{50 * msec, 100 * msec, 100 * msec}, E2E: 1150 * msec, OutputTokens: 4, Chunks: 4},
		{Sent: 500 * msec, TTFT: 600 * msec, ITLs: []time.Duration{100 * msec}, E2E: 700 * msec, OutputTokens: 2, Chunks: 2},
	}}
	// Chunks at 0.90 0.95 | 1.05 1.15 and 1.10 1.20: second 1 holds 4.
	if got := Summarize(res, MetricOptions{}).MaxOutputTokensPerS; got != 4 {
		t.Fatalf("peak %v, want 4", got)
	}
}

func TestParseOptions(t *testing.T) {
	slo, err := ParseGoodput([]string{"ttft:500 tpot:50", "e2el:2000.5"})
	if err != nil || slo.TTFT != 500*msec || slo.TPOT != 50*msec || slo.E2EL != 2000500*time.Microsecond {
		t.Fatalf("ParseGoodput = %+v, %v", slo, err)
	}
	for _, bad := range []string{"ttft", "ttft:x", "ttft:-1", "itl:5"} {
		if _, err := ParseGoodput([]string{bad}); err == nil {
			t.Errorf("ParseGoodput(%q) accepted", bad)
		}
	}
	m, err := ParsePercentileMetrics("ttft, e2el,ttft")
	if err != nil || len(m) != 2 || m[1] != "e2el" {
		t.Fatalf("ParsePercentileMetrics = %v, %v", m, err)
	}
	if _, err := ParsePercentileMetrics("ttft,queue"); err == nil {
		t.Error("unknown metric accepted")
	}
	ps, err := ParseMetricPercentiles("50,90,99.9")
	if err != nil || len(ps) != 3 || ps[2] != 99.9 {
		t.Fatalf("ParseMetricPercentiles = %v, %v", ps, err)
	}
	if _, err := ParseMetricPercentiles("101"); err == nil {
		t.Error("101 accepted")
	}
}
