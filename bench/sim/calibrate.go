package sim

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"
)

// CalibrationTolerance is how far a checked calibration row may land from
// its published target (±25%).
const CalibrationTolerance = 0.25

// CalibrationRow is one published measurement (shared/calibration.md) next
// to what the simulator gives for the same workload in virtual time.
type CalibrationRow struct {
	Row      string  // calibration.md section: A, B, C
	Metric   string  // what is compared
	Profile  string  // built-in profile used
	Workload string  // how it was driven
	Unit     string  // of Target and Got
	Target   float64 // published
	Got      float64 // simulated
	// Checked rows must land within CalibrationTolerance; the others are
	// shown for context (the published figure is loose or inconsistent).
	Checked bool
	Note    string // why an unchecked row may deviate
}

// Deviation is Got/Target − 1.
func (r CalibrationRow) Deviation() float64 { return r.Got/r.Target - 1 }

// OK reports whether the row is within tolerance (always true when not
// checked).
func (r CalibrationRow) OK() bool {
	return !r.Checked || math.Abs(r.Deviation()) <= CalibrationTolerance
}

// calibrationCase is one scenario: a workload on a profile and how to read
// the report.
type calibrationCase struct {
	row, metric, profile, workload, unit string
	target                               float64
	checked                              bool
	note                                 string
	w                                    Workload
	read                                 func(Report) float64
}

func seconds(d time.Duration) float64 { return d.Seconds() }
func millis(d time.Duration) float64  { return float64(d) / 1e6 }

func calibrationCases() []calibrationCase {
	// A: a 5-word chat prompt is ~13 tokens after the chat template.
	batch1 := func(out int, target float64) calibrationCase {
		return calibrationCase{
			row: "A", metric: fmt.Sprintf("latency, %d tokens out, batch 1", out), profile: "qwen2.5-7b",
			workload: "5-word prompt (13 tok), one request at a time", unit: "s", target: target, checked: true,
			w: Workload{NumPrompts: 3, MaxConcurrency: 1, IgnoreEOS: true,
				Classes: []RequestClass{{InputLen: 13, OutputLen: out}}},
			read: func(r Report) float64 { return seconds(r.E2E.Mean) },
		}
	}
	// The mixed run's use cases (ultra-short, short, code, medium, long
	// form), weighted so the mean output is ≈207 tokens (20,486 / 99).
	mixed := []RequestClass{
		{Weight: 1, InputLen: 30, OutputLen: 15, RangeRatio: 0.2},
		{Weight: 1, InputLen: 50, OutputLen: 60, RangeRatio: 0.2},
		{Weight: 1, InputLen: 150, OutputLen: 100, RangeRatio: 0.2},
		{Weight: 1, InputLen: 100, OutputLen: 150, RangeRatio: 0.2},
		{Weight: 2.5, InputLen: 80, OutputLen: 400, RangeRatio: 0.2},
	}
	mixedW := Workload{NumPrompts: 200, MaxConcurrency: 16, IgnoreEOS: true, Seed: 1, Classes: mixed}

	// B: one of the four replicas (the proxy added no queueing); long
	// prompts fill TinyLlama's 2048-token context as the reported KV usage
	// implies, answers 400–500 tokens.
	tinyW := Workload{NumPrompts: 1150, MaxConcurrency: 230, Warmup: 230, IgnoreEOS: true, Seed: 2,
		Classes: []RequestClass{{InputLen: 1400, OutputLen: 450, RangeRatio: 0.08}}}

	longTTFT := Workload{NumPrompts: 3, MaxConcurrency: 1, IgnoreEOS: true,
		Classes: []RequestClass{{InputLen: 32000, OutputLen: 100}}}
	// Decode speed at long context: the run's peak of 9 requests at ~32k
	// context decoding together. (The published e2e and TPOT imply far
	// more than 100 output tokens and cannot both hold at 1 req/s with a
	// 1 s prefill, so the two TTFT/TPOT figures are reproduced separately.)
	longDecode := Workload{NumPrompts: 9, IgnoreEOS: true,
		Classes: []RequestClass{{InputLen: 32000, OutputLen: 300}}}
	genHeavy := Workload{NumPrompts: 200, RequestRate: 1, IgnoreEOS: true, Seed: 3,
		Classes: []RequestClass{{InputLen: 1000, OutputLen: 2000}}}
	throughput := Workload{NumPrompts: 1000, MaxConcurrency: 512, IgnoreEOS: true, Seed: 4,
		Classes: []RequestClass{{InputLen: 1024, OutputLen: 128}}}

	return []calibrationCase{
		batch1(10, 0.105), batch1(20, 0.206), batch1(50, 0.512), batch1(100, 1.021),
		{row: "A", metric: "output throughput, 16 concurrent", profile: "qwen2.5-7b",
			workload: "mixed use cases, mean 207 tok out, 200 requests", unit: "tok/s", target: 949, checked: true,
			w: mixedW, read: func(r Report) float64 { return r.OutputThroughput }},
		{row: "A", metric: "per-request rate, 16 concurrent (70–100)", profile: "qwen2.5-7b",
			workload: "same run: 1 / mean TPOT", unit: "tok/s", target: 85,
			note: "published as a 70–100 range that 949 tok/s over 16 streams (59 each) does not reach either",
			w:    mixedW, read: func(r Report) float64 { return 1 / seconds(r.TPOT.Mean) }},
		{row: "B", metric: "ITL at ~230 concurrent per replica", profile: "tinyllama-1.1b-a10",
			workload: "230 streams, 1300–1500 tok in, 400–500 out, steady state", unit: "s", target: 0.1, checked: true,
			w: tinyW, read: func(r Report) float64 { return seconds(r.ITL.Mean) }},
		{row: "B", metric: "KV cache usage (50–60%)", profile: "tinyllama-1.1b-a10",
			workload: "same run, time-weighted", unit: "frac", target: 0.55,
			note: "depends on prompt lengths the source does not give",
			w:    tinyW, read: func(r Report) float64 { return r.MeanKVUsage }},
		{row: "B", metric: "e2e P95 (40–50 s)", profile: "tinyllama-1.1b-a10",
			workload: "same run", unit: "s", target: 45,
			w: tinyW, read: func(r Report) float64 { return seconds(r.E2E.P95) }},
		{row: "C", metric: "long-context TTFT", profile: "qwen3.5-9b-h100",
			workload: "32,000 tok in, idle engine", unit: "ms", target: 1021, checked: true,
			w: longTTFT, read: func(r Report) float64 { return millis(r.TTFT.Mean) }},
		{row: "C", metric: "long-context TPOT (median ITL)", profile: "qwen3.5-9b-h100",
			workload: "9 × 32,000 tok in decoding together", unit: "ms", target: 10.2, checked: true,
			w: longDecode, read: func(r Report) float64 { return millis(r.ITL.Median) }},
		{row: "C", metric: "generation-heavy TTFT", profile: "qwen3.5-9b-h100",
			workload: "1,000 in / 2,000 out, 1 req/s, 200 requests", unit: "ms", target: 55, checked: true,
			w: genHeavy, read: func(r Report) float64 { return millis(r.TTFT.Mean) }},
		{row: "C", metric: "generation-heavy output throughput", profile: "qwen3.5-9b-h100",
			workload: "same run", unit: "tok/s", target: 1976,
			w: genHeavy, read: func(r Report) float64 { return r.OutputThroughput }},
		{row: "C", metric: "generation-heavy e2e mean", profile: "qwen3.5-9b-h100",
			workload: "same run", unit: "s", target: 17.5,
			w: genHeavy, read: func(r Report) float64 { return seconds(r.E2E.Mean) }},
		{row: "C", metric: "throughput profile total tok/s", profile: "qwen3.5-9b-h100",
			workload: "1024 in / 128 out, 1000 at once, concurrency 512", unit: "tok/s", target: 29822,
			w: throughput, read: func(r Report) float64 { return r.TotalTokenThroughput }},
		{row: "C", metric: "throughput profile mean TTFT", profile: "qwen3.5-9b-h100",
			workload: "same run", unit: "ms", target: 4433,
			note: "published TTFT + 127·TPOT = 8.8 s, yet 512 in flight at 23.3 req/s means 22 s e2e (Little's law); throughput is what holds",
			w:    throughput, read: func(r Report) float64 { return millis(r.TTFT.Mean) }},
		{row: "C", metric: "throughput profile mean TPOT", profile: "qwen3.5-9b-h100",
			workload: "same run", unit: "ms", target: 34.6,
			note: "see the TTFT row",
			w:    throughput, read: func(r Report) float64 { return millis(r.TPOT.Mean) }},
	}
}

// Calibrate runs every calibration scenario in virtual time (a few seconds
// of CPU) and returns target against simulated, row by row.
func Calibrate() ([]CalibrationRow, error) {
	cache := map[string]Report{}
	var rows []CalibrationRow
	for _, c := range calibrationCases() {
		k := fmt.Sprintf("%s/%+v", c.profile, c.w)
		rep, ok := cache[k]
		if !ok {
			p, err := Builtin(c.profile)
			if err != nil {
				return nil, err
			}
			if rep, err = Simulate(p, c.w); err != nil {
				return nil, fmt.Errorf("sim: calibration %s %q: %w", c.row, c.metric, err)
			}
			cache[k] = rep
		}
		rows = append(rows, CalibrationRow{Row: c.row, Metric: c.metric, Profile: c.profile, Workload: c.workload,
			Unit: c.unit, Target: c.target, Got: c.read(rep), Checked: c.checked, Note: c.note})
	}
	return rows, nil
}

// WriteCalibrationTable prints rows as an aligned table.
func WriteCalibrationTable(w io.Writer, rows []CalibrationRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "row\tmetric\tprofile\ttarget\tsimulated\tdev\tcheck\tworkload")
	for _, r := range rows {
		check := "info"
		if r.Checked {
			check = "ok"
			if !r.OK() {
				check = "FAIL"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s %s\t%s %s\t%+.0f%%\t%s\t%s\n", r.Row, r.Metric, r.Profile,
			fmtNum(r.Target), r.Unit, fmtNum(r.Got), r.Unit, 100*r.Deviation(), check, r.Workload)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if r.Note != "" {
			if _, err := fmt.Fprintf(w, "note: %s %s: %s\n", r.Row, r.Metric, r.Note); err != nil {
				return err
			}
		}
	}
	_, err := fmt.Fprintf(w, "checked rows must land within ±%.0f%%; info rows are context\n", 100*CalibrationTolerance)
	return err
}

func fmtNum(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.3f", x)
	}
}
