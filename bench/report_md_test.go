package bench

import (
	"bytes"
	"flag"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/sketch"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the current output")

// reportRun is a hand-built, deterministic run of the usecase mix: TTFT
// 40–70 ms, about 10 ms per output token, every fifth request queued up to
// 300 ms more, two failures (3%) and a client lag P99 above 5 ms. The
// request lengths come from seed, the timing noise from noise; offset
// shifts every TTFT (for an A/B side).
func reportRun(seed, noise uint64, offset time.Duration) *Result {
	rng, nrng := newRand(seed), newRand(noise)
	cases := UseCases()
	res := &Result{
		Start: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Duration: 20 * time.Second,
		BaseURL: "http://127.0.0.1:8080", Endpoint: EndpointCompletions, Model: "Qwen/Qwen2.5-7B-Instruct",
		RequestRate: 4, Burstiness: 1,
	}
	for i := range 66 {
		uc := cases[i%len(cases)]
		out := rangeLen(rng, uc.OutputTokens, 0.2, 2)
		r := Record{
			Index: i, ID: "bench-" + itoa(i), UseCase: uc.Name, PromptTokens: uc.InputTokens, MaxTokens: out,
			Sent: time.Duration(i) * 250 * time.Millisecond, Lag: 200 * time.Microsecond,
		}
		if i == 20 || i == 41 {
			r.Lag = 9 * time.Millisecond
		}
		if i == 13 || i == 52 {
			r.Status, r.Reason, r.End = 503, ReasonHTTP(503), r.Sent+5*time.Millisecond
			if i == 52 {
				r.Status, r.Reason = 0, ReasonTimeout
			}
			res.Records = append(res.Records, r)
			continue
		}
		r.OutputTokens, r.Chunks, r.UsageReported = out, out, true
		r.TTFT = 40*time.Millisecond + time.Duration(nrng.IntN(30))*time.Millisecond + offset
		if i%5 == 0 {
			r.TTFT += time.Duration(nrng.IntN(300)) * time.Millisecond
		}
		r.ITLs = make([]time.Duration, out-1)
		e2e := r.TTFT
		for k := range r.ITLs {
			r.ITLs[k] = 9*time.Millisecond + time.Duration(nrng.IntN(2000))*time.Microsecond
			e2e += r.ITLs[k]
		}
		r.E2E, r.End = e2e, r.Sent+e2e+time.Millisecond
		res.Records = append(res.Records, r)
	}
	return res
}

// histFrom builds a histogram with the given bounds (+Inf added) from
// per-bucket counts, and a mean.
func histFrom(bounds []float64, counts []float64, mean float64) Histogram {
	h := Histogram{Bounds: append(append([]float64(nil), bounds...), math.Inf(1))}
	var c float64
	for i := range h.Bounds {
		if i < len(counts) {
			c += counts[i]
		}
		h.Cumulative = append(h.Cumulative, c)
	}
	h.Count, h.Sum = c, c*mean
	return h
}

func reportInput(t *testing.T) ReportInput {
	t.Helper()
	itlBounds := []float64{0.01, 0.025, 0.05, 0.075, 0.1}
	ttftBounds := []float64{0.01, 0.02, 0.04, 0.06, 0.08, 0.1}
	e2eBounds := []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5}
	router := HistogramColumn{Name: "router", Rows: map[string]Histogram{
		RowTTFT:  histFrom(ttftBounds, []float64{0, 0, 2, 40, 22}, 0.058),
		RowITL:   histFrom(itlBounds, []float64{2000, 7000, 10}, 0.0101),
		RowE2E:   histFrom(e2eBounds, []float64{14, 13, 12, 2, 11, 5, 7}, 1.2),
		RowQueue: histFrom([]float64{0.3, 0.5}, []float64{64}, 0.002),
	}}
	engine := HistogramColumn{Name: "engine", Rows: map[string]Histogram{
		RowTTFT:  histFrom(ttftBounds, []float64{0, 0, 3, 41, 20}, 0.055),
		RowITL:   histFrom(itlBounds, []float64{2100, 6900, 10}, 0.0100),
		RowE2E:   histFrom(e2eBounds, []float64{14, 13, 12, 2, 11, 5, 7}, 1.19),
		RowQueue: histFrom([]float64{0.3, 0.5}, []float64{64}, 0.004),
	}}
	slos := []NamedSLO{{Name: "interactive", SLO: SLO{TTFT: 500 * msec, TPOT: 50 * msec}}, {SLO: SLO{TPOT: 100 * msec}}}
	var sweeps []TargetSweep
	for _, tgt := range []struct {
		name  string
		knee  float64
		speed float64
	}{{"direct", 2, 1}, {"router", 4, 1.6}} {
		ts := TargetSweep{Target: tgt.name}
		for _, rate := range []float64{1, 2, 4, 8, math.Inf(1)} {
			load := rate / tgt.knee
			if math.IsInf(rate, 1) {
				load = 8
			}
			ttft := 60 + 300*load*load
			tpot := 12 + 15*load
			ts.Points = append(ts.Points, handPoint(tgt.name, rate, ttft, tpot, math.Min(rate, 2*tgt.knee)*tgt.speed*120, slos))
		}
		sweeps = append(sweeps, ts)
	}
	res := reportRun(7, 1, 0)
	// The router's sketches and records of the run: every gap the client
	// read, 5 µs shorter at the router, and a 2 ms queue per request.
	itl, queue := sketch.New(), sketch.New()
	var recs []RouterRecord
	for _, r := range res.Records {
		if !r.OK() {
			continue
		}
		var sum time.Duration
		for _, g := range r.ITLs {
			itl.Record(g - 5*time.Microsecond)
			sum += g - 5*time.Microsecond
		}
		queue.Record(2 * time.Millisecond)
		recs = append(recs, RouterRecord{RequestID: r.ID, Outcome: "ok", FirstTokenNs: 1, QueueS: 0.002, TTFTS: r.TTFT.Seconds(), E2ES: r.E2E.Seconds(),
			ITLCount: len(r.ITLs), ITLMeanS: (sum / time.Duration(max(len(r.ITLs), 1))).Seconds(), CompletionTokens: r.OutputTokens})
	}
	itlSnap, queueSnap := itl.Snapshot(), queue.Snapshot()
	router.Sketches = map[string]*sketch.Snapshot{RowITL: &itlSnap, RowQueue: &queueSnap}
	match := MatchRouterRecords(res, recs)
	b := ABArm{Label: "least-loaded", Result: reportRun(7, 2, -15*time.Millisecond)}
	a := ABArm{Label: "round-robin", Result: res}
	a.Summary, b.Summary = Summarize(a.Result, MetricOptions{}), Summarize(b.Result, MetricOptions{})
	ab := CompareAB(a, b, nil, BootstrapOptions{Seed: 3})
	return ReportInput{
		Notes:  []string{"Command: `gpurouter bench --base-url http://127.0.0.1:8080 --dataset-name usecase --request-rate 4`"},
		Result: res, Router: &router, Engine: &engine, RouterMatch: &match,
		Breakdown: NewLatencyBreakdown(1.2,
			BreakdownComponent{Name: "network + router overhead", Seconds: 0.004},
			BreakdownComponent{Name: "router queue", Seconds: 0.002, Queue: true},
			BreakdownComponent{Name: "engine queue", Seconds: 0.004, Queue: true},
			BreakdownComponent{Name: "prefill", Seconds: 0.05},
			BreakdownComponent{Name: "decode", Seconds: 1.1},
			BreakdownComponent{Name: "engine frontend", Seconds: math.NaN()}),
		Sweeps: sweeps, SLOs: slos,
		AB: ab,
	}
}

func TestWriteReportGolden(t *testing.T) {
	dir := t.TempDir()
	if err := WriteReport(dir, reportInput(t)); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "golden", "report.md")
	if *update {
		if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./bench/ -run TestWriteReportGolden -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("report.md differs from %s (rerun with -update if the change is intended):\n%s", golden, firstDiff(string(got), string(want)))
	}
	wantPlots := []string{PlotLatencyVsOutput, PlotPercentiles, PlotBreakdown, PlotUseCases, PlotThroughput, plotSLOMatrix(0), plotSLOMatrix(1)}
	for _, name := range wantPlots {
		checkPNG(t, filepath.Join(dir, name))
		if !strings.Contains(string(got), "]("+name+")") {
			t.Errorf("report does not link %s", name)
		}
	}
}

// checkPNG fails unless path is a PNG of a plausible size with content.
func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	bnd := img.Bounds()
	if fi.Size() < 5000 || bnd.Dx() < 300 || bnd.Dy() < 200 {
		t.Fatalf("%s: %d bytes, %dx%d: too small to be a plot", path, fi.Size(), bnd.Dx(), bnd.Dy())
	}
	colors := map[[4]uint32]bool{}
	for y := bnd.Min.Y; y < bnd.Max.Y && len(colors) < 3; y += 7 {
		for x := bnd.Min.X; x < bnd.Max.X; x += 7 {
			r, g, b, a := img.At(x, y).RGBA()
			colors[[4]uint32{r, g, b, a}] = true
		}
	}
	if len(colors) < 3 {
		t.Fatalf("%s: blank image", path)
	}
}

// firstDiff shows the first differing line of two texts.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + itoa(i+1) + ":\n got: " + gl + "\nwant: " + wl
		}
	}
	return "(no line differs)"
}

func TestWriteReportSubsets(t *testing.T) {
	full := reportInput(t)
	tests := []struct {
		name     string
		in       ReportInput
		sections []string
		absent   []string
		plots    []string
	}{
		{"empty", ReportInput{}, []string{"# gpurouter benchmark report", "## Diagnosis", "Nothing to diagnose"}, []string{"## Run", "## Summary"}, nil},
		{"run only", ReportInput{Title: "t", Result: full.Result}, []string{"# t", "## Run", "## Summary", "## Latency by use case", "(failures)", "(length-fit)"},
			[]string{"## Client vs server", "## Time allocation", "## Rate sweep", "## A/B", "(queue)"},
			[]string{PlotLatencyVsOutput, PlotPercentiles, PlotUseCases}},
		{"sweep only", ReportInput{Sweeps: full.Sweeps, SLOs: full.SLOs}, []string{"## Rate sweep", "(capacity)"}, []string{"## Run", "## Summary"},
			[]string{PlotThroughput, plotSLOMatrix(0), plotSLOMatrix(1)}},
		{"sweep without SLOs", ReportInput{Sweeps: full.Sweeps}, []string{"## Rate sweep"}, []string{"SLO compliance"}, []string{PlotThroughput}},
		{"A/B only", ReportInput{AB: full.AB}, []string{"## A/B comparison", "(ab)"}, []string{"## Run"}, nil},
		{"engine column only", ReportInput{Result: full.Result, Engine: full.Engine}, []string{"| metric | stat | client | engine |", "(queue)"}, []string{"(router-itl)"},
			[]string{PlotLatencyVsOutput, PlotPercentiles, PlotUseCases}},
		{"breakdown only", ReportInput{Breakdown: full.Breakdown}, []string{"## Time allocation", "| engine frontend | - | - |", "(queue)"}, []string{"## Summary"}, []string{PlotBreakdown}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := WriteReport(dir, tt.in); err != nil {
				t.Fatal(err)
			}
			md, err := os.ReadFile(filepath.Join(dir, ReportFile))
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tt.sections {
				if !strings.Contains(string(md), s) {
					t.Errorf("missing %q", s)
				}
			}
			for _, s := range tt.absent {
				if strings.Contains(string(md), s) {
					t.Errorf("unexpected %q", s)
				}
			}
			entries, _ := os.ReadDir(dir)
			var pngs []string
			for _, e := range entries {
				if strings.HasSuffix(e.Name(), ".png") {
					pngs = append(pngs, e.Name())
				}
			}
			if strings.Join(pngs, ",") != strings.Join(slices.Sorted(slices.Values(tt.plots)), ",") {
				t.Errorf("plots %v, want %v", pngs, tt.plots)
			}
			if t.Failed() {
				t.Logf("report:\n%s", md)
			}
		})
	}
}
