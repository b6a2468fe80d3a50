package bench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/sketch"
)

// tableWidth is the client/router/engine table's width.
const tableWidth = 84

// WriteServerReport prints, after the vllm result block: the latency table
// (rows TTFT, ITL, TPOT, E2E and queue; columns client, router and engine,
// in ms), the per-request client − router differences, the router's view
// of each replica, and the decomposition of the mean request. Without a
// router there is no router column and no per-request section.
//
// Client cells are vllm bench's statistics over completed requests. Router
// cells are exact statistics of the router's per-request records of the
// matched requests, except ITL percentiles (its records keep only each
// request's mean and maximum gap), which come from the router's sketches
// of every gap (within 0.5%), or from its histogram's buckets when the router
// has no sketches (an older gpurouter: the table says so). Engine cells
// come from the engines' vLLM histograms: the mean from _sum/_count,
// percentiles only as precisely as their bucket resolves them
// (estimateCell).
func WriteServerReport(w io.Writer, s *Summary, rep *ServerReport, ps []float64) error {
	c := &consoleWriter{w: w}
	title := " Client vs Router vs Engine Latency (ms) "
	if !rep.Router {
		title = " Client vs Engine Latency (ms) "
	}
	c.line(center(title, '=', tableWidth))
	header := fmt.Sprintf("%-6s %-5s %12s", "metric", "stat", "client")
	if rep.Router {
		header += fmt.Sprintf("  %-28s", "router")
	}
	header += fmt.Sprintf("  %-28s", "engine")
	c.line(header)
	var rd RouterDists
	if rep.Router {
		rd = rep.Match.Dists(ps)
	}
	for _, row := range ComparisonRows() {
		var client *Dist
		if row != RowQueue {
			d := s.Dist(row)
			client = &d
		}
		for _, p := range append([]float64{-1}, ps...) { // -1: the mean
			label := "mean"
			if p >= 0 {
				label = "P" + percentileLabel(p)
			}
			line := fmt.Sprintf("%-6s %-5s %12s", strings.ToUpper(row), label, clientCell(client, p))
			if rep.Router {
				line += fmt.Sprintf("  %-28s", routerCell(rd, rep.RouterHist, row, p))
			}
			line += fmt.Sprintf("  %-28s", histCell(rep.Engine, row, p))
			c.line(line)
		}
	}
	if rep.Router {
		c.line(routerNote(rep))
	}
	c.line("engine: vLLM histogram deltas (means exact)")
	c.line(BucketNote)
	if rep.Router {
		writeMatch(c, rep.Match, ps)
		writeReplicas(c, rep.Match.ByReplica(), rep.Capacity)
		if e, n := rep.Match.PredictorError(); n > 0 {
			c.line(fmt.Sprintf("Predictor |error| (predicted vs measured TTFT from send, %d requests): P50 %.0f ms  P90 %.0f ms  (P50 %.0f%%  P90 %.0f%% of measured)",
				n, e.AbsMs50, e.AbsMs90, e.Rel50*100, e.Rel90*100))
		}
	}
	c.line(strings.Repeat("=", tableWidth))
	if c.err != nil {
		return c.err
	}
	return WriteDecomposition(w, rep.Decomposition)
}

// routerNote says where the router column's numbers come from.
func routerNote(rep *ServerReport) string {
	if rep.RouterSketches != nil {
		return fmt.Sprintf("router: per-request records, exact; ITL percentiles: its sketch of every gap (within %g%%)", 100*rep.RouterSketches.Accuracy)
	}
	why := "not read"
	switch {
	case errors.Is(rep.SketchErr, ErrNoLatencyEndpoint):
		why = "this router has no /debug/latency"
	case errors.Is(rep.SketchErr, ErrSketchRetention):
		why = "the run outlasted the router's sketch windows"
	case rep.SketchErr != nil:
		why = rep.SketchErr.Error()
	}
	return "router: per-request records, exact; ITL percentiles: its histogram buckets (" + why + ")"
}

// routerCell is one router cell: an exact statistic from the records, or
// for ITL percentiles the router's sketch (else its histogram).
func routerCell(d RouterDists, hist HistogramColumn, row string, p float64) string {
	var dist *Dist
	switch row {
	case RowTTFT:
		dist = &d.TTFT
	case RowTPOT:
		dist = &d.TPOT
	case RowE2E:
		dist = &d.E2E
	case RowQueue:
		dist = &d.Queue
	case RowITL:
		if p < 0 {
			if math.IsNaN(d.ITLMean) {
				return "-"
			}
			return fmt.Sprintf("%.2f", d.ITLMean)
		}
		return histCell(hist, row, p)
	}
	return clientCell(dist, p)
}

func writeMatch(c *consoleWriter, m RouterMatch, ps []float64) {
	c.line(center(" Client - Router, Matched per Request (ms) ", '-', tableWidth))
	c.line(fmt.Sprintf("%-40s %d of %d", "Completed requests matched:", len(m.Pairs), m.Completed))
	if n := len(m.Unmatched); n > 0 {
		ids := m.Unmatched[:min(n, 3)]
		c.line(fmt.Sprintf("%-40s %d (e.g. %s)", "Unmatched:", n, strings.Join(ids, ", ")))
	}
	if len(m.Pairs) == 0 {
		return
	}
	ttft, e2e := m.Diffs(ps)
	diffs := []struct {
		name string
		d    Dist
	}{{"TTFT", ttft}, {"E2E", e2e}}
	if itl := m.ITLDiffs(ps); itl.Count > 0 {
		diffs = append(diffs, struct {
			name string
			d    Dist
		}{"ITL", itl}) // each request's mean gap
	}
	for _, x := range diffs {
		line := fmt.Sprintf("%-4s difference  mean %.3f  P50 %.3f", x.name, x.d.Mean, x.d.Median)
		for _, p := range ps {
			if p != 50 {
				line += fmt.Sprintf("  P%s %.3f", percentileLabel(p), x.d.At(p))
			}
		}
		c.line(line + fmt.Sprintf("  max %.3f", x.d.Max))
	}
	if d, n := m.PromptEstimateError(ps); n > 0 {
		c.line(fmt.Sprintf("Prompt token estimate error (router vs engine, %%, %d requests): mean %+.1f  P50 %+.1f  min %+.1f  max %+.1f", n, d.Mean, d.Median, d.Min, d.Max))
	}
}

func writeReplicas(c *consoleWriter, reps []ReplicaSummary, capacity map[string]float64) {
	if len(reps) == 0 {
		return
	}
	shares, capShares := Shares(reps, capacity)
	c.line(center(" Per Replica (router records) ", '-', tableWidth))
	c.line(fmt.Sprintf("%-22s %8s %7s %7s %10s %10s %10s %10s %9s", "replica", "requests", "share", "cap", "TTFT ms", "TPOT ms", "E2E ms", "queue ms", "out tok"))
	for i, r := range reps {
		tpot := "-"
		if !math.IsNaN(r.MeanTPOT) {
			tpot = fmt.Sprintf("%.2f", r.MeanTPOT)
		}
		capCell := "-"
		if !math.IsNaN(capShares[i]) {
			capCell = fmt.Sprintf("%.1f%%", capShares[i]*100)
		}
		c.line(fmt.Sprintf("%-22s %8d %6.1f%% %7s %10.2f %10s %10.2f %10.3f %9.1f", r.Replica, r.Requests, shares[i]*100, capCell, r.MeanTTFT, tpot, r.MeanE2E, r.MeanQueue, r.MeanOutputTokens))
	}
	if capacity != nil {
		c.line("share: of the requests served; cap: of the capacity the router measured (learned prefill rate)")
	}
}

// Shares returns each replica's share of the requests and its share of the
// measured capacity (NaN for each replica when any has no measurement).
func Shares(reps []ReplicaSummary, capacity map[string]float64) (shares, capShares []float64) {
	var n, total float64
	complete := len(capacity) > 0
	for _, r := range reps {
		n += float64(r.Requests)
		if v, ok := capacity[r.Replica]; ok {
			total += v
		} else {
			complete = false
		}
	}
	shares, capShares = make([]float64, len(reps)), make([]float64, len(reps))
	for i, r := range reps {
		shares[i] = float64(r.Requests) / max(n, 1)
		capShares[i] = math.NaN()
		if complete && total > 0 {
			capShares[i] = capacity[r.Replica] / total
		}
	}
	return shares, capShares
}

// JSON is the report for a result file's Extra keys: the router and engine
// columns, the per-request differences and the decomposition, in ms (null
// where not measured).
func (rep *ServerReport) JSON(ps []float64) map[string]any {
	out := map[string]any{
		"gpurouter_router":                 rep.Router,
		"gpurouter_engine_urls":            rep.MetricsURLs,
		"gpurouter_engine_latency_ms":      HistogramColumnJSON(rep.Engine, ps),
		"gpurouter_decomposition_ms":       decompositionJSON(rep.Decomposition),
		"gpurouter_decomposition_residual": finiteOrNil(rep.Decomposition.ResidualShare()),
	}
	if !rep.Router {
		return out
	}
	rd := rep.Match.Dists(ps)
	router := map[string]any{
		RowTTFT:  distJSON(rd.TTFT, ps),
		RowTPOT:  distJSON(rd.TPOT, ps),
		RowE2E:   distJSON(rd.E2E, ps),
		RowQueue: distJSON(rd.Queue, ps),
		RowITL:   map[string]any{"mean": finiteOrNil(rd.ITLMean), "max": finiteOrNil(rd.ITLMax)},
	}
	if h, ok := rep.RouterHist.Rows[RowITL]; ok {
		router[RowITL].(map[string]any)["histogram"] = histJSON(h, ps)
	}
	if rs := rep.RouterSketches; rs != nil {
		router[RowITL].(map[string]any)["sketch"] = sketchJSON(rs.ITL, rs.Accuracy, ps)
		router[RowQueue].(map[string]any)["sketch"] = sketchJSON(rs.Queue, rs.Accuracy, ps)
	}
	out["gpurouter_router_latency_ms"] = router
	ttft, e2e := rep.Match.Diffs(ps)
	out["gpurouter_client_minus_router_ms"] = map[string]any{
		"matched":   len(rep.Match.Pairs),
		"completed": rep.Match.Completed,
		"unmatched": len(rep.Match.Unmatched),
		RowTTFT:     distJSON(ttft, ps),
		RowE2E:      distJSON(e2e, ps),
		RowITL:      distJSON(rep.Match.ITLDiffs(ps), ps), // per request: client mean gap − router mean gap
	}
	var reps []map[string]any
	byReplica := rep.Match.ByReplica()
	shares, capShares := Shares(byReplica, rep.Capacity)
	for i, r := range byReplica {
		reps = append(reps, map[string]any{
			"replica": r.Replica, "requests": r.Requests, "mean_ttft_ms": r.MeanTTFT, "mean_tpot_ms": finiteOrNil(r.MeanTPOT),
			"mean_e2e_ms": r.MeanE2E, "mean_queue_ms": r.MeanQueue, "mean_output_tokens": r.MeanOutputTokens,
			"request_share": shares[i], "capacity_share": finiteOrNil(capShares[i]),
		})
	}
	if e, n := rep.Match.PredictorError(); n > 0 {
		out["gpurouter_predictor_ttft_abs_error_ms"] = map[string]any{"n": n, "p50": e.AbsMs50, "p90": e.AbsMs90, "rel_p50": e.Rel50, "rel_p90": e.Rel90}
	}
	out["gpurouter_router_requests"] = rep.Match.PerRequestJSON()
	out["gpurouter_replicas"] = reps
	return out
}

// HistogramColumnJSON is a histogram column for a result file: per row, the
// count, the mean and each percentile with its bucket, in ms.
func HistogramColumnJSON(col HistogramColumn, ps []float64) map[string]any {
	out := map[string]any{}
	for _, row := range ComparisonRows() {
		if h, ok := col.Rows[row]; ok {
			out[row] = histJSON(h, ps)
		}
	}
	return out
}

func histJSON(h Histogram, ps []float64) map[string]any {
	r := map[string]any{"count": h.Count, "mean": msOrNil(h.Mean())}
	for _, p := range ps {
		e := h.Quantile(p / 100)
		r["p"+percentileLabel(p)] = map[string]any{"value": msOrNil(e.Value), "lower": msOrNil(e.Lower), "upper": msOrNil(e.Upper)}
	}
	return r
}

// sketchJSON is a router sketch for a result file: count, exact mean and
// extremes, and each percentile (within accuracy), in ms.
func sketchJSON(s sketch.Snapshot, accuracy float64, ps []float64) map[string]any {
	r := map[string]any{"count": s.Count, "relative_accuracy": accuracy}
	if s.Count == 0 {
		return r
	}
	r["mean"], r["min"], r["max"] = ms(s.Mean()), ms(time.Duration(s.MinNs)), ms(time.Duration(s.MaxNs))
	for _, p := range ps {
		v, _ := s.Quantile(p / 100)
		r["p"+percentileLabel(p)] = ms(v)
	}
	return r
}

func distJSON(d Dist, ps []float64) map[string]any {
	r := map[string]any{"count": d.Count, "mean": d.Mean, "median": d.Median, "max": d.Max}
	for _, p := range ps {
		r["p"+percentileLabel(p)] = d.At(p)
	}
	return r
}

func decompositionJSON(d Decomposition) map[string]any {
	out := map[string]any{"requests": d.Requests, "client_e2e": msOrNil(d.ClientE2E), "residual": msOrNil(d.Residual)}
	comps := map[string]any{}
	for _, c := range d.Components {
		comps[c.Name] = msOrNil(c.Seconds)
	}
	parts := map[string]any{}
	for _, p := range d.ResidualParts {
		parts[p.Name] = msOrNil(p.Seconds)
	}
	out["components"], out["residual_parts"] = comps, parts
	return out
}

// finiteOrNil is v, or nil (JSON null) for NaN and ±Inf.
func finiteOrNil(v float64) any {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return v
}

// msOrNil converts seconds to ms, nil when not finite.
func msOrNil(v float64) any {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return v * 1000
}
