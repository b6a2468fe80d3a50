package bench

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

func TestVerdict(t *testing.T) {
	// timeline(): P99 TTFT 198 ms, P99 TPOT 39.8 ms, P99 E2EL 238.4 ms.
	s := Summarize(timeline(), MetricOptions{})
	tests := []struct {
		name string
		slo  SLO
		p    float64
		want string
	}{
		{"all met", SLO{TTFT: 200 * msec, TPOT: 40 * msec}, 99, "PASS"},
		{"ttft over", SLO{TTFT: 150 * msec, TPOT: 40 * msec}, 99, "FAIL (TTFT)"},
		{"tpot over", SLO{TTFT: 200 * msec, TPOT: 30 * msec}, 99, "FAIL (TPOT)"},
		{"both over", SLO{TTFT: 150 * msec, TPOT: 30 * msec}, 99, "FAIL (TTFT+TPOT)"},
		{"judged at the median", SLO{TTFT: 150 * msec, TPOT: 30 * msec}, 50, "PASS"},
		{"e2el", SLO{E2EL: 200 * msec}, 99, "FAIL (E2EL)"},
		{"nothing set", SLO{}, 99, "PASS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Verdict(s, tt.slo, tt.p); got != tt.want {
				t.Fatalf("Verdict = %q, want %q", got, tt.want)
			}
		})
	}
	if got := Verdict(Summarize(&Result{}, MetricOptions{}), SLO{TTFT: time.Hour}, 99); got != "FAIL (TTFT)" {
		t.Fatalf("empty run: %q, want FAIL (TTFT)", got)
	}
}

func TestSweepMarkdown(t *testing.T) {
	up := startUpstream(t, func(string) sseScript { return sseScript{tokens: 3, gap: time.Millisecond} })
	slos := []NamedSLO{{SLO: SLO{TTFT: time.Second, TPOT: 500 * msec}}, {Name: "impossible", SLO: SLO{TTFT: time.Nanosecond}}}
	var seen []float64
	points, err := Sweep(context.Background(), SweepConfig{
		Base:  Config{BaseURL: up.url, Model: "m", Requests: fixedRequests(8, 3)},
		Rates: []float64{400, math.Inf(1)}, SLOs: slos,
		OnPoint: func(p SweepPoint) { seen = append(seen, p.Rate) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(points) != 2 || len(seen) != 2 || points[0].Result.RequestRate != 400 {
		t.Fatalf("%d points, callbacks %v", len(points), seen)
	}
	for _, p := range points {
		if p.Summary.Completed != 8 || p.Verdicts[0] != "PASS" || p.Verdicts[1] != "FAIL (TTFT)" {
			t.Fatalf("rate %v: completed %d verdicts %v", p.Rate, p.Summary.Completed, p.Verdicts)
		}
	}
	var buf bytes.Buffer
	if err := WriteSweepMarkdown(&buf, points, slos, 0); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"| rate (req/s) |", "SLO TTFT≤1000ms TPOT≤500ms", "SLO impossible", "| 400 | 8 | 0 |", "| inf | 8 | 0 |", "| PASS | FAIL (TTFT) |"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if _, err := Sweep(context.Background(), SweepConfig{}); err == nil {
		t.Error("sweep without rates accepted")
	}
}

// handPoint is a sweep point whose latencies are all ttft and tpot (ms),
// judged against slos at P99.
func handPoint(target string, rate, ttft, tpot, outTput float64, slos []NamedSLO) SweepPoint {
	achieved, conc := rate, int(rate)+1
	if math.IsInf(rate, 1) {
		achieved, conc = 12, 40
	}
	s := &Summary{
		Completed: 10, OutputThroughput: outTput, RequestThroughput: achieved, MaxConcurrentRequests: conc,
		TTFT: newDist([]float64{ttft, ttft}, nil), TPOT: newDist([]float64{tpot, tpot}, nil), E2EL: newDist([]float64{ttft + 100*tpot}, nil),
	}
	p := SweepPoint{Target: target, Rate: rate, Summary: s}
	for _, slo := range slos {
		p.Verdicts = append(p.Verdicts, Verdict(s, slo.SLO, 99))
	}
	return p
}

func TestMaxCompliantRate(t *testing.T) {
	slos := []NamedSLO{{SLO: SLO{TTFT: 500 * msec, TPOT: 50 * msec}}}
	pt := func(rate, ttft, tpot float64) SweepPoint { return handPoint("x", rate, ttft, tpot, 10*rate, slos) }
	tests := []struct {
		name   string
		points []SweepPoint
		want   float64
		wantOK bool
	}{
		{"all pass", []SweepPoint{pt(1, 100, 10), pt(2, 200, 20), pt(4, 300, 30)}, 4, true},
		{"fails from 4", []SweepPoint{pt(1, 100, 10), pt(2, 200, 20), pt(4, 900, 30), pt(8, 900, 90)}, 2, true},
		{"run order does not matter", []SweepPoint{pt(4, 900, 30), pt(1, 100, 10), pt(2, 200, 20)}, 2, true},
		{"a lucky pass above a failure does not count", []SweepPoint{pt(1, 100, 10), pt(2, 100, 60), pt(4, 100, 10)}, 1, true},
		{"lowest fails", []SweepPoint{pt(1, 600, 10), pt(2, 100, 10)}, 0, false},
		{"inf passes", []SweepPoint{pt(1, 100, 10), pt(math.Inf(1), 100, 10)}, math.Inf(1), true},
		{"no points", nil, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := MaxCompliantRate(tt.points, 0)
			if ok != tt.wantOK || (ok && got.Rate != tt.want) {
				t.Fatalf("MaxCompliantRate = %v, %v; want %v, %v", got.Rate, ok, tt.want, tt.wantOK)
			}
		})
	}
	if _, ok := MaxCompliantRate([]SweepPoint{pt(1, 1, 1)}, 3); ok {
		t.Fatal("SLO index out of range accepted")
	}
}

func TestWinners(t *testing.T) {
	slos := []NamedSLO{{Name: "interactive", SLO: SLO{TTFT: 200 * msec, TPOT: 30 * msec}}, {Name: "batch", SLO: SLO{TPOT: 100 * msec}}}
	// "direct" degrades from 2 req/s, "router" from 8; for batch both pass
	// at every rate and the tie goes to the higher output throughput.
	sweeps := []TargetSweep{
		{Target: "direct", Points: []SweepPoint{
			handPoint("direct", 1, 100, 20, 100, slos), handPoint("direct", 2, 150, 25, 200, slos),
			handPoint("direct", 4, 400, 40, 300, slos), handPoint("direct", 8, 900, 60, 310, slos)}},
		{Target: "router", Points: []SweepPoint{
			handPoint("router", 1, 90, 20, 100, slos), handPoint("router", 2, 100, 22, 200, slos),
			handPoint("router", 4, 150, 26, 400, slos), handPoint("router", 8, 300, 35, 700, slos)}},
		{Target: "never", Points: []SweepPoint{handPoint("never", 1, 900, 200, 50, slos)}},
	}
	ws := Winners(sweeps, slos)
	if len(ws) != 2 {
		t.Fatalf("%d winners", len(ws))
	}
	w := ws[0]
	if w.Winner != 1 || w.Capacities[0].Rate != 2 || w.Capacities[1].Rate != 4 || w.Capacities[1].VsFirst != 2 || w.Capacities[2].OK || !math.IsNaN(w.Capacities[2].VsFirst) {
		t.Fatalf("interactive: %+v", w)
	}
	if b := ws[1]; b.Winner != 1 || b.Capacities[0].Rate != 8 || b.Capacities[1].Rate != 8 || b.Capacities[1].VsFirst != 1 || b.Capacities[1].OutputThroughput != 700 {
		t.Fatalf("batch: %+v", b)
	}
	none := Winners([]TargetSweep{{Target: "never", Points: sweeps[2].Points}}, slos[:1])
	if none[0].Winner != -1 {
		t.Fatalf("winner without a compliant rate: %+v", none[0])
	}

	var buf bytes.Buffer
	if err := WriteSweepComparison(&buf, sweeps, slos, 0); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"| target | rate (req/s) | completed | failed | req/s | output tok/s | P99 TTFT (ms) | P99 TPOT (ms) | P99 E2EL (ms) | max concurrent |",
		"| router | 8 | 10 | 0 | 8.00 | 700.0 | 300.0 | 35.0 |",
		"**SLO compliance: interactive (judged at P99)**",
		"| rate (req/s) | direct | router | never |",
		"| 4 | FAIL (TTFT+TPOT) | PASS | - |",
		"| 8 | FAIL (TTFT+TPOT) | FAIL (TTFT+TPOT) | - |",
		"| 1 | PASS | PASS | FAIL (TTFT+TPOT) |",
		"| router | 4 | 400.0 | 2.00× |",
		"| never | none | - | - |",
		"Winner: **router** at 4 req/s (2.00× the capacity of direct).",
		"Winner: **router** at 8 req/s (1.00× the capacity of direct); tied on rate with direct, ahead on output tok/s.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

func TestSweepTargets(t *testing.T) {
	fast := startUpstream(t, func(string) sseScript { return sseScript{tokens: 3, gap: time.Millisecond} })
	slow := startUpstream(t, func(string) sseScript { return sseScript{tokens: 3, gap: 60 * time.Millisecond} })
	slos := []NamedSLO{{SLO: SLO{TPOT: 30 * msec}}}
	var seen []string
	sweeps, err := SweepTargets(context.Background(), SweepConfig{
		Base:  Config{BaseURL: "http://unused.invalid", Model: "m", Requests: fixedRequests(4, 3), Headers: map[string]string{"X-Base": "1"}},
		Rates: []float64{math.Inf(1)}, SLOs: slos,
		OnPoint: func(p SweepPoint) { seen = append(seen, p.Target) },
	}, []SweepTarget{{Label: "slow", BaseURL: slow.url}, {Label: "fast", BaseURL: fast.url, Headers: map[string]string{"X-Arm": "b"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sweeps) != 2 || strings.Join(seen, ",") != "slow,fast" || sweeps[1].Points[0].Target != "fast" {
		t.Fatalf("sweeps %+v, callbacks %v", sweeps, seen)
	}
	if v := sweeps[0].Points[0].Verdicts[0]; v != "FAIL (TPOT)" {
		t.Fatalf("slow: %s", v)
	}
	if v := sweeps[1].Points[0].Verdicts[0]; v != "PASS" {
		t.Fatalf("fast: %s", v)
	}
	if w := Winners(sweeps, slos)[0]; w.Winner != 1 {
		t.Fatalf("winner %+v", w)
	}
	if _, err := SweepTargets(context.Background(), SweepConfig{Rates: []float64{1}}, nil); err == nil {
		t.Fatal("no targets accepted")
	}
}
