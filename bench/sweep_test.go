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
