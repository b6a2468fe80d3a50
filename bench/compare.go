package bench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/gpurouter/gpurouter/sketch"
)

// Rows of a client/server latency comparison.
const (
	RowTTFT  = "ttft"
	RowITL   = "itl"
	RowTPOT  = "tpot"
	RowE2E   = "e2el"
	RowQueue = "queue"
)

// ComparisonRows lists the rows in print order.
func ComparisonRows() []string { return []string{RowTTFT, RowITL, RowTPOT, RowE2E, RowQueue} }

// VLLMHistogramNames maps comparison rows to vLLM's histograms, newest name
// first, older names after (vllm-reference.md §1.3).
func VLLMHistogramNames() map[string][]string {
	return map[string][]string{
		RowTTFT:  {"vllm:time_to_first_token_seconds"},
		RowITL:   {"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"},
		RowTPOT:  {"vllm:request_time_per_output_token_seconds"},
		RowE2E:   {"vllm:e2e_request_latency_seconds"},
		RowQueue: {"vllm:request_queue_time_seconds"},
	}
}

// HistogramColumn is one server-side view of a run, an engine's or the
// router's: per comparison row, the histogram of observations made during
// the run. A row missing from Rows prints as "-". The zero value is an
// unnamed, empty column.
type HistogramColumn struct {
	Name string
	Rows map[string]Histogram
	// Sketches are rows measured exactly (the router's DDSketches of ITL
	// and queue time, within 0.5%): where a row has one, its mean and
	// percentiles come from it rather than from the buckets.
	Sketches map[string]*sketch.Snapshot
}

// sketchOf is row's sketch, nil when the row has none or it is empty.
func (c HistogramColumn) sketchOf(row string) *sketch.Snapshot {
	if s := c.Sketches[row]; s != nil && s.Count > 0 {
		return s
	}
	return nil
}

// ColumnFromSnapshots builds a column from metrics scraped before and after
// a run on one or more servers: per row, the first of its names found,
// delta per server, summed over servers (e.g. every engine behind a
// router). Rows that cannot be computed are left out, with the reasons
// joined in the error; the column is usable either way.
func ColumnFromSnapshots(name string, before, after []Snapshot, names map[string][]string, match map[string]string) (HistogramColumn, error) {
	col := HistogramColumn{Name: name, Rows: map[string]Histogram{}}
	if len(before) != len(after) {
		return col, fmt.Errorf("bench: %d snapshots before, %d after", len(before), len(after))
	}
	var errs []error
	for _, row := range ComparisonRows() {
		var sum Histogram
		ok := len(after) > 0
		for i := range after {
			var d Histogram
			var err error
			for _, n := range names[row] {
				if d, err = HistogramDelta(before[i], after[i], n, match); !errors.Is(err, ErrNoMetric) {
					break
				}
			}
			if err == nil {
				sum, err = sum.Add(d)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s (server %d): %w", name, row, i, err))
				ok = false
				break
			}
		}
		if ok {
			col.Rows[row] = sum
		}
	}
	return col, errors.Join(errs...)
}

// WriteComparison prints the client's latencies next to each column's
// histogram estimates, in ms: mean (exact, from _sum/_count) and each
// percentile as histCell writes it (as precisely as its bucket resolves
// it). The client has no server queue, so that row shows only the columns.
func WriteComparison(w io.Writer, s *Summary, percentiles []float64, cols ...HistogramColumn) error {
	c := &consoleWriter{w: w}
	c.line(center(" Client vs Server Latency (ms) ", '=', consoleWidth))
	header := fmt.Sprintf("%-6s %-6s %12s", "metric", "stat", "client")
	for _, col := range cols {
		header += fmt.Sprintf("  %-26s", col.Name)
	}
	c.line(header)
	for _, row := range ComparisonRows() {
		var client *Dist
		if row != RowQueue {
			d := s.Dist(row)
			client = &d
		}
		stats := append([]float64{-1}, percentiles...) // -1: the mean
		for _, p := range stats {
			label := "mean"
			if p >= 0 {
				label = "P" + percentileLabel(p)
			}
			line := fmt.Sprintf("%-6s %-6s %12s", strings.ToUpper(row), label, clientCell(client, p))
			for _, col := range cols {
				line += fmt.Sprintf("  %-26s", histCell(col, row, p))
			}
			c.line(line)
		}
	}
	c.line(BucketNote)
	c.line(strings.Repeat("=", consoleWidth))
	return c.err
}

func clientCell(d *Dist, p float64) string {
	if d == nil || d.Count == 0 {
		return "-"
	}
	if p < 0 {
		return fmt.Sprintf("%.2f", d.Mean)
	}
	return fmt.Sprintf("%.2f", d.At(p))
}

// histCell is one server cell: the row's sketch when it has one (exact),
// else its histogram's mean (exact) or percentile (estimateCell).
func histCell(col HistogramColumn, row string, p float64) string {
	if s := col.sketchOf(row); s != nil {
		if p < 0 {
			return fmt.Sprintf("%.2f", ms(s.Mean()))
		}
		v, _ := s.Quantile(p / 100)
		return fmt.Sprintf("%.2f", ms(v))
	}
	h, ok := col.Rows[row]
	if !ok || h.Count == 0 {
		return "-"
	}
	if p < 0 {
		return fmt.Sprintf("%.2f", h.Mean()*1000)
	}
	return estimateCell(h.Quantile(p / 100))
}

// BucketNote explains estimateCell's forms, once per table.
const BucketNote = `histogram percentiles: "v [a–b]" interpolated where the bucket is narrow (b ≤ 1.5a);
"[a–b]" alone where it is wider, "≤ b" in the first bucket (0–b): no invented numbers`

// estimateCell writes a histogram percentile (s) in ms only as precisely
// as its bucket resolves it: in the first bucket, which starts at 0, the
// bound ("≤ 300"); in a bucket reaching more than half again its lower bound
// (Estimate.Resolved), the bucket alone ("[10–25]"); in the +Inf bucket,
// the bound it exceeds ("> 80000"); otherwise the interpolated value with
// its bucket ("64.00 [60–80]").
func estimateCell(e Estimate) string {
	switch {
	case math.IsNaN(e.Value):
		return "-"
	case e.Lower <= 0:
		return "≤ " + boundMS(e.Upper)
	case math.IsInf(e.Upper, 1):
		return "> " + boundMS(e.Lower)
	case !e.Resolved():
		return fmt.Sprintf("[%s–%s]", boundMS(e.Lower), boundMS(e.Upper))
	}
	return fmt.Sprintf("%.2f [%s–%s]", e.Value*1000, boundMS(e.Lower), boundMS(e.Upper))
}

func boundMS(v float64) string {
	if math.IsInf(v, 0) {
		if v > 0 {
			return "+Inf"
		}
		return "-Inf"
	}
	return fmt.Sprintf("%g", v*1000)
}
