package bench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/sketch"
)

func TestDiagnoseRouterITLExact(t *testing.T) {
	nan := math.NaN()
	none := Estimate{nan, nan, nan}
	perReq := func(mean float64) Dist { return newDist([]float64{mean, mean, mean}, []float64{50, 99}) }
	tests := []struct {
		name     string
		c        ITLComparison
		level    string
		contains []string
	}{
		{"equal, engine bucket too wide to say more",
			ITLComparison{Client: 11.86, Router: 11.84, Accuracy: 0.01, PerRequest: perReq(0.002), RouterHist: none, Engine: Estimate{0.0176, 0.01, 0.025}},
			LevelOK, []string{"ITL at the router equals ITL at the client", "P50 11.86 ms at the client, 11.84 ms ±1% at the router", "+0.002 ms", "adds no queueing between tokens", "10–25 ms, which holds the router's"}},
		{"equal, engine bucket resolves",
			ITLComparison{Client: 85.1, Router: 85.0, Accuracy: 0.01, RouterHist: none, Engine: Estimate{0.086, 0.075, 0.1}},
			LevelOK, []string{"equals ITL at the client", "(86.00 ms in 75–100 ms) agrees within its bucket"}},
		{"the router holds tokens back from the client",
			ITLComparison{Client: 14, Router: 11.8, Accuracy: 0.01, PerRequest: perReq(2.1), RouterHist: none, Engine: Estimate{0.017, 0.01, 0.025}},
			LevelWarn, []string{"exceeds ITL at the router", "between the router and the client"}},
		{"tokens wait between engine and router",
			ITLComparison{Client: 30, Router: 30, Accuracy: 0.01, RouterHist: none, Engine: Estimate{0.017, 0.01, 0.025}},
			LevelWarn, []string{"equals ITL at the client", "10–25 ms, below the router's", "between engine and router"}},
		{"engines saw other traffic",
			ITLComparison{Client: 5, Router: 5, Accuracy: 0.01, RouterHist: none, Engine: Estimate{0.017, 0.01, 0.025}},
			LevelInfo, []string{"above the router's"}},
		{"within 0.2 ms is equal",
			ITLComparison{Client: 5.15, Router: 5.0, Accuracy: 0.01, RouterHist: none, Engine: none},
			LevelOK, []string{"adds no queueing"}},
		{"per request only (router without sketches)",
			ITLComparison{Client: 11.9, Router: nan, PerRequest: perReq(0.01), RouterHist: Estimate{0.0175, 0.01, 0.025}, Engine: Estimate{0.0176, 0.01, 0.025}},
			LevelOK, []string{"per request, the client's mean gap minus the router's is +0.010 ms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, ok := DiagnoseRouterITL(tt.c)
			checkFinding(t, f, ok, true, tt.level, tt.contains)
		})
	}
	if _, ok := DiagnoseRouterITL(ITLComparison{Client: nan, Router: nan, RouterHist: none, Engine: none}); ok {
		t.Error("a finding from nothing")
	}
}

// The report's inputs reach the rule: the router column's sketch, the
// client's summary and the matched requests.
func TestReportInputITLComparison(t *testing.T) {
	in := reportInput(t)
	c, ok := in.itlComparison()
	if !ok || math.IsNaN(c.Router) || c.Accuracy != sketch.RelativeAccuracy || c.PerRequest.Count == 0 || math.IsNaN(c.Engine.Value) {
		t.Fatalf("comparison %+v", c)
	}
	if math.Abs(c.Router-c.Client) > 0.2 {
		t.Errorf("fixture: router P50 %.3f, client %.3f", c.Router, c.Client)
	}
	in.Router = nil
	if _, ok := in.itlComparison(); ok {
		t.Error("no router column, yet a comparison")
	}
}

func TestEstimateCell(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	tests := []struct {
		name string
		e    Estimate
		want string
	}{
		{"first bucket: the bound only", Estimate{0.15, 0, 0.3}, "≤ 300"},
		{"first bucket of a histogram starting at 0", Estimate{0, math.Inf(-1), 0}, "≤ 0"},
		{"a bucket 2.5× wide: the bucket only", Estimate{0.0176, 0.01, 0.025}, "[10–25]"},
		{"a bucket 2× wide: the bucket only", Estimate{0.02743, 0.02, 0.04}, "[20–40]"},
		{"a bucket 1.5× wide resolves", Estimate{0.0125, 0.01, 0.015}, "12.50 [10–15]"},
		{"a narrow bucket", Estimate{1.3, 1, 1.5}, "1300.00 [1000–1500]"},
		{"past the last bound", Estimate{80, 80, inf}, "> 80000"},
		{"nothing", Estimate{nan, nan, nan}, "-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := estimateCell(tt.e); got != tt.want {
				t.Errorf("%+v: %q, want %q", tt.e, got, tt.want)
			}
		})
	}
}

// A column's sketch row prints exact numbers, its histogram rows honest
// ones; the engine's queue median inside vLLM's first bucket is "≤ 300",
// never 150.
func TestHistCellSketchAndBuckets(t *testing.T) {
	s := sketch.New()
	for i := range 1000 {
		s.Record(time.Duration(11000+i) * time.Microsecond)
	}
	snap := s.Snapshot()
	col := HistogramColumn{Rows: map[string]Histogram{
		RowITL:   histFrom([]float64{0.01, 0.025, 0.05}, []float64{0, 1000}, 0.0115),
		RowQueue: histFrom([]float64{0.3, 0.5}, []float64{64}, 0.0067),
	}}
	if got := histCell(col, RowQueue, 50); got != "≤ 300" {
		t.Errorf("queue P50 %q", got)
	}
	if got := histCell(col, RowQueue, -1); got != "6.70" {
		t.Errorf("queue mean %q: means stay exact", got)
	}
	if got := histCell(col, RowITL, 50); got != "[10–25]" {
		t.Errorf("ITL P50 from buckets %q", got)
	}
	col.Sketches = map[string]*sketch.Snapshot{RowITL: &snap}
	if got := histCell(col, RowITL, 50); !strings.HasPrefix(got, "11.") || strings.Contains(got, "[") {
		t.Errorf("ITL P50 from the sketch %q", got)
	}
}
