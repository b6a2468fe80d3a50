package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestDiagnoseFailures(t *testing.T) {
	tests := []struct {
		name              string
		completed, failed int
		reasons           map[string]int
		wantOK            bool
		level             string
		contains          []string
	}{
		{"no requests", 0, 0, nil, false, "", nil},
		{"none failed", 100, 0, nil, true, LevelOK, []string{"No request failed"}},
		{"exactly 1% is within", 99, 1, map[string]int{"timeout": 1}, true, LevelInfo, []string{"within 1%", "timeout ×1"}},
		{"over 1% names reasons by count", 95, 5, map[string]int{"timeout": 1, "http_503": 3, "connect": 1}, true, LevelWarn,
			[]string{"5 of 100 requests failed (5.0% > 1%)", "http_503 ×3, connect ×1, timeout ×1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, ok := DiagnoseFailures(tt.completed, tt.failed, tt.reasons, 0.01)
			checkFinding(t, f, ok, tt.wantOK, tt.level, tt.contains)
		})
	}
}

func TestDiagnoseClientLag(t *testing.T) {
	tests := []struct {
		name     string
		p99      float64
		level    string
		contains string
	}{
		{"kept up", 0.4, LevelOK, "kept to its schedule"},
		{"at the limit", 5, LevelOK, "≤ 5ms"},
		{"bottleneck", 12.5, LevelWarn, "Client lag P99 is 12.5 ms (> 5ms): the load generator was a bottleneck"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, ok := DiagnoseClientLag(tt.p99, 5*time.Millisecond)
			checkFinding(t, f, ok, true, tt.level, []string{tt.contains})
		})
	}
}

func TestDiagnoseQueue(t *testing.T) {
	tests := []struct {
		name       string
		queue, e2e float64
		wantOK     bool
		level      string
		contains   string
	}{
		{"saturated", 1.7, 2.0, true, LevelWarn, "Queue time is 85% of e2e (d of 2.000 s mean, > 50%): the pool is saturated — add replicas or raise max_num_seqs"},
		{"half is not over", 1, 2, true, LevelOK, "50% of e2e"},
		{"light", 0.1, 2, true, LevelOK, "not saturated"},
		{"no e2e", 1, 0, false, "", ""},
		{"unknown queue", math.NaN(), 1, false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, ok := DiagnoseQueue(tt.queue, tt.e2e, "d", 0.5)
			checkFinding(t, f, ok, tt.wantOK, tt.level, []string{tt.contains})
		})
	}
}

func TestDiagnoseRouterITLBuckets(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name           string
		router, engine Estimate
		wantOK         bool
		level          string
		contains       string
	}{
		{"same bucket", Estimate{0.012, 0.01, 0.025}, Estimate{0.018, 0.01, 0.025}, true, LevelOK, "ITL at router equals ITL at engine"},
		{"equal values on a bound", Estimate{0.025, 0.01, 0.025}, Estimate{0.025, 0.01, 0.025}, true, LevelOK, "adds no queueing"},
		{"router a bucket higher", Estimate{0.03, 0.025, 0.05}, Estimate{0.02, 0.01, 0.025}, true, LevelWarn, "exceeds ITL at the engine"},
		{"router lower", Estimate{0.005, 0, 0.01}, Estimate{0.02, 0.01, 0.025}, true, LevelInfo, "below ITL at the engine"},
		{"unknown", Estimate{nan, nan, nan}, Estimate{0.02, 0.01, 0.025}, false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, ok := DiagnoseRouterITL(ITLComparison{Client: nan, Router: nan, RouterHist: tt.router, Engine: tt.engine})
			checkFinding(t, f, ok, tt.wantOK, tt.level, []string{tt.contains})
		})
	}
}

func TestFitLine(t *testing.T) {
	xs := []float64{10, 20, 50, 100}
	// calibration.md row A: 0.105, 0.206, 0.512, 1.021 s.
	f, ok := FitLine(xs, []float64{0.105, 0.206, 0.512, 1.021})
	if !ok || math.Abs(f.B-0.0101785) > 1e-5 || math.Abs(f.A-0.00348) > 1e-3 || f.R2 < 0.9999 || f.N != 4 {
		t.Fatalf("fit %+v ok %v", f, ok)
	}
	exact, _ := FitLine([]float64{1, 2, 3}, []float64{3, 5, 7})
	if !near(exact.A, 1) || !near(exact.B, 2) || !near(exact.R2, 1) {
		t.Fatalf("exact fit %+v", exact)
	}
	noise, _ := FitLine([]float64{1, 2, 3, 4}, []float64{1, -1, 1, -1})
	if noise.R2 > 0.5 {
		t.Fatalf("noise R² %v", noise.R2)
	}
	for _, bad := range [][2][]float64{{{1, 2}, {1, 2}}, {{2, 2, 2}, {1, 2, 3}}, {{1, 2, 3}, {1, 2}}} {
		if _, ok := FitLine(bad[0], bad[1]); ok {
			t.Errorf("FitLine(%v, %v) ok", bad[0], bad[1])
		}
	}
}

func TestDiagnoseLengthFit(t *testing.T) {
	f, ok := DiagnoseLengthFit(LineFit{A: 0.105, B: 0.0102, R2: 0.97, N: 50}, 0.9)
	checkFinding(t, f, ok, true, LevelInfo, []string{"E2e is explained by output length × ITL", "a = 105.0 ms, b = 10.20 ms/token, R² = 0.970 over 50 requests"})
	f, ok = DiagnoseLengthFit(LineFit{A: 1, B: 0.01, R2: 0.4, N: 50}, 0.9)
	checkFinding(t, f, ok, true, LevelInfo, []string{"not explained by output length alone", "R² = 0.400"})
}

func TestDiagnoseCapacityAndAB(t *testing.T) {
	slo := NamedSLO{Name: "chat"}
	f, ok := DiagnoseCapacity(SweepWinner{SLO: slo, Winner: 1, Capacities: []Capacity{{Target: "a", OK: true, Rate: 2, VsFirst: 1}, {Target: "b", OK: true, Rate: 4, VsFirst: 2}}})
	checkFinding(t, f, ok, true, LevelInfo, []string{"Under the SLO chat, b sustains the most: 4 req/s, 2.00× the capacity of a."})
	f, ok = DiagnoseCapacity(SweepWinner{SLO: slo, Winner: -1, Capacities: []Capacity{{Target: "a"}}})
	checkFinding(t, f, ok, true, LevelWarn, []string{"No target met the SLO chat"})

	ab := &ABResult{A: ABArm{Label: "x"}, B: ABArm{Label: "y"}, Bootstrap: BootstrapOptions{Level: 0.95}, Rows: []ABRow{
		{Metric: MetricTTFT, P: 50, CI: DiffCI{A: 100, B: 80, Delta: -20, Lower: -25, Upper: -15, Resamples: 10}},
		{Metric: MetricE2EL, P: 99, CI: DiffCI{A: 100, B: 101, Delta: 1, Lower: -5, Upper: 6, Resamples: 10}},
	}}
	f, ok = DiagnoseAB(ab)
	checkFinding(t, f, ok, true, LevelInfo, []string{"y vs x differs significantly in P50 TTFT -20.0 ms (-20.0%, CI [-25.0, -15.0])"})
	ab.Rows = ab.Rows[1:]
	f, _ = DiagnoseAB(ab)
	checkFinding(t, f, true, true, LevelInfo, []string{"no difference between x and y is significant at 95%"})
}

func checkFinding(t *testing.T, f Finding, ok, wantOK bool, level string, contains []string) {
	t.Helper()
	if ok != wantOK {
		t.Fatalf("ok = %v, want %v (%+v)", ok, wantOK, f)
	}
	if !ok {
		return
	}
	if f.Level != level || f.Rule == "" {
		t.Errorf("level %q rule %q, want level %q: %s", f.Level, f.Rule, level, f.Text)
	}
	for _, c := range contains {
		if !strings.Contains(f.Text, c) {
			t.Errorf("%q\nmissing %q", f.Text, c)
		}
	}
}

func TestDiagnoseCapacityTie(t *testing.T) {
	f, ok := DiagnoseCapacity(SweepWinner{SLO: NamedSLO{Name: "s"}, Winner: 1, Capacities: []Capacity{{Target: "a", OK: true, Rate: 8, VsFirst: 1}, {Target: "b", OK: true, Rate: 8, VsFirst: 1}}})
	checkFinding(t, f, ok, true, LevelInfo, []string{"b sustains the most: 8 req/s, tied on rate with a and ahead on output tok/s."})
}
