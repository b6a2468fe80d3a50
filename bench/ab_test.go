package bench

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

func TestRunABSameScheduleBothSides(t *testing.T) {
	up := startUpstream(t, func(id string) sseScript {
		if strings.Contains(id, "-slow-") {
			return sseScript{tokens: 4, gap: 15 * time.Millisecond}
		}
		return sseScript{tokens: 4, gap: time.Millisecond}
	})
	var sides []string
	r, err := RunAB(context.Background(), ABConfig{
		Base: Config{BaseURL: up.url, Model: "m", Requests: fixedRequests(12, 4), RequestRate: 400, Seed: 9,
			RequestIDPrefix: "t-", Headers: map[string]string{"X-Base": "1"}},
		A:         ABSide{Label: "slow", Headers: map[string]string{DefaultArmHeader: "rr"}},
		B:         ABSide{Label: "fast", BaseURL: up.url, Headers: map[string]string{DefaultArmHeader: "ll"}},
		Bootstrap: BootstrapOptions{Resamples: 200, Seed: 1},
		OnSide:    func(a ABArm) { sides = append(sides, a.Label) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(sides, ",") != "slow,fast" || !r.Paired || r.Bootstrap.Resamples != 200 || r.Bootstrap.Level != 0.95 {
		t.Fatalf("sides %v, result %+v", sides, r)
	}
	for i := range r.A.Result.Records {
		a, b := r.A.Result.Records[i], r.B.Result.Records[i]
		if a.Scheduled != b.Scheduled || a.Index != b.Index {
			t.Fatalf("request %d scheduled at %v on A, %v on B", i, a.Scheduled, b.Scheduled)
		}
		if a.ID != "t-slow-"+itoa(i) || b.ID != "t-fast-"+itoa(i) {
			t.Fatalf("ids %q %q", a.ID, b.ID)
		}
	}
	la, lb := up.log("t-slow-0"), up.log("t-fast-0")
	if la == nil || lb == nil {
		t.Fatal("upstream did not see both sides")
	}
	if len(r.Rows) != 6 {
		t.Fatalf("%d rows", len(r.Rows))
	}
	for _, row := range r.Rows {
		if row.Metric == MetricTPOT && (!row.CI.Significant() || row.CI.Delta > -10) {
			t.Errorf("P%v TPOT: %+v, want a significant drop of ~14 ms", row.P, row.CI)
		}
	}
	var buf bytes.Buffer
	if err := WriteABMarkdown(&buf, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"A = **slow**, B = **fast**", "200 paired bootstrap resamples", "| P50 TPOT |", "significant: B lower"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("missing %q in\n%s", want, buf.String())
		}
	}
}

func TestRunABDefaultLabels(t *testing.T) {
	up := startUpstream(t, func(string) sseScript { return sseScript{tokens: 2} })
	_, err := RunAB(context.Background(), ABConfig{
		Base: Config{BaseURL: up.url, Model: "m", Requests: fixedRequests(2, 2), Headers: map[string]string{DefaultArmHeader: "base"}},
		A:    ABSide{Headers: map[string]string{DefaultArmHeader: "a"}},
		B:    ABSide{Headers: map[string]string{DefaultArmHeader: "b"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Unlabelled sides are A and B; each request's ID names its side.
	for _, id := range []string{"bench-A-0", "bench-B-1"} {
		if up.log(id) == nil {
			t.Fatalf("no request %s", id)
		}
	}
}

func TestCompareABHandBuilt(t *testing.T) {
	mk := func(ttft time.Duration, fail map[int]bool) *Result {
		res := &Result{}
		for i := range 50 {
			r := Record{Index: i, OutputTokens: 3, Chunks: 3, TTFT: ttft + time.Duration(i%10)*time.Millisecond}
			r.ITLs = []time.Duration{10 * msec, 10 * msec}
			r.E2E = r.TTFT + 20*msec
			if fail[i] {
				r = Record{Index: i, Reason: ReasonTimeout}
			}
			res.Records = append(res.Records, r)
		}
		return res
	}
	a := ABArm{Label: "a", Result: mk(100*msec, map[int]bool{3: true})}
	b := ABArm{Label: "b", Result: mk(60*msec, map[int]bool{7: true})}
	r := CompareAB(a, b, []float64{50}, BootstrapOptions{Seed: 5, Resamples: 300})
	if !r.Paired || len(r.Rows) != 3 {
		t.Fatalf("%+v", r)
	}
	for _, row := range r.Rows {
		switch row.Metric {
		case MetricTTFT, MetricE2EL:
			// −40 ms, ±1 ms for the failed request each side drops.
			if !row.CI.Significant() || math.Abs(row.CI.Delta+40) > 1 {
				t.Errorf("%s: %+v, want about −40 ms, significant", row.Metric, row.CI)
			}
		case MetricTPOT:
			if row.CI.Significant() || row.CI.Delta != 0 {
				t.Errorf("tpot: %+v, want no difference", row.CI)
			}
		}
	}
	// A side with no completed request has nothing to compare.
	empty := CompareAB(a, ABArm{Label: "none", Result: &Result{Records: []Record{{Reason: ReasonConnect}}}}, nil, BootstrapOptions{})
	var buf bytes.Buffer
	if err := WriteABMarkdown(&buf, empty); err != nil {
		t.Fatal(err)
	}
	if empty.Paired || empty.Rows[0].CI.Resamples != 0 || !strings.Contains(buf.String(), "| P50 TTFT | - | - | - | - | - | no data |") {
		t.Fatalf("empty side: %+v\n%s", empty.Rows[0], buf.String())
	}
}
