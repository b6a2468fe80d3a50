package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Finding levels: OK states a healthy reading, Info a neutral fact, Warn a
// problem to act on.
const (
	LevelOK   = "ok"
	LevelInfo = "info"
	LevelWarn = "warn"
)

// Finding is one sentence of a report's diagnosis, written from the
// numbers by one rule.
type Finding struct {
	// Rule names the rule that wrote it (e.g. "queue", "failures").
	Rule  string
	Level string
	Text  string
}

// DiagnosisThresholds are the rules' thresholds. Zero fields mean the
// defaults given on each.
type DiagnosisThresholds struct {
	// QueueShare: router + engine queue time above this fraction of the mean
	// e2e latency means the pool is saturated; default 0.5.
	QueueShare float64
	// FitR2: a line e2e ≈ a + b·tokens fitting with R² above this explains
	// e2e by output length; default 0.9.
	FitR2 float64
	// FailureRate: failures above this fraction of requests are a problem;
	// default 0.01.
	FailureRate float64
	// ClientLagP99: the load generator's P99 lag above this means the client
	// was a bottleneck; default 5 ms.
	ClientLagP99 time.Duration
}

func (t DiagnosisThresholds) withDefaults() DiagnosisThresholds {
	if t.QueueShare == 0 {
		t.QueueShare = 0.5
	}
	if t.FitR2 == 0 {
		t.FitR2 = 0.9
	}
	if t.FailureRate == 0 {
		t.FailureRate = 0.01
	}
	if t.ClientLagP99 == 0 {
		t.ClientLagP99 = 5 * time.Millisecond
	}
	return t
}

// Diagnose applies every rule whose inputs in has, in a fixed order:
// failures, client lag, queueing, router ITL (against the client's and
// the engines', diagnosis_itl.go), e2e vs output length, sweep capacity,
// A/B.
func Diagnose(in ReportInput) []Finding {
	th := in.Thresholds.withDefaults()
	var out []Finding
	add := func(f Finding, ok bool) {
		if ok {
			out = append(out, f)
		}
	}
	s := in.summary()
	if s != nil {
		add(DiagnoseFailures(s.Completed, s.Failed, s.FailuresByReason, th.FailureRate))
		if s.Lag.Count > 0 {
			add(DiagnoseClientLag(s.Lag.At(99), th.ClientLagP99))
		}
	}
	if q, e2e, detail, ok := in.queueShare(); ok {
		add(DiagnoseQueue(q, e2e, detail, th.QueueShare))
	}
	if c, ok := in.itlComparison(); ok {
		add(DiagnoseRouterITL(c))
	}
	if in.Result != nil {
		if fit, ok := fitE2E(in.Result.Records); ok {
			add(DiagnoseLengthFit(fit, th.FitR2))
		}
	}
	for _, w := range Winners(in.Sweeps, in.SLOs) {
		add(DiagnoseCapacity(w))
	}
	if in.AB != nil {
		add(DiagnoseAB(in.AB))
	}
	return out
}

// DiagnoseFailures flags a failure rate above maxRate, naming the reasons
// by count (most frequent first). No requests: no finding.
func DiagnoseFailures(completed, failed int, byReason map[string]int, maxRate float64) (Finding, bool) {
	total := completed + failed
	if total == 0 {
		return Finding{}, false
	}
	f := Finding{Rule: "failures"}
	rate := float64(failed) / float64(total)
	switch {
	case failed == 0:
		f.Level, f.Text = LevelOK, fmt.Sprintf("No request failed (%d completed).", completed)
	case rate > maxRate:
		f.Level = LevelWarn
		f.Text = fmt.Sprintf("%d of %d requests failed (%.1f%% > %.0f%%): %s. Latency percentiles cover only the completed requests.",
			failed, total, 100*rate, 100*maxRate, reasonsText(byReason))
	default:
		f.Level = LevelInfo
		f.Text = fmt.Sprintf("%d of %d requests failed (%.2f%%, within %.0f%%): %s.", failed, total, 100*rate, 100*maxRate, reasonsText(byReason))
	}
	return f, true
}

// reasonsText lists failure reasons as "http_503 ×20, timeout ×3", most
// frequent first, ties by name.
func reasonsText(byReason map[string]int) string {
	keys := make([]string, 0, len(byReason))
	for k := range byReason {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if byReason[a] != byReason[b] {
			return byReason[b] - byReason[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s ×%d", k, byReason[k])
	}
	if len(parts) == 0 {
		return "no reason recorded"
	}
	return strings.Join(parts, ", ")
}

// DiagnoseClientLag warns when the load generator's P99 lag (ms) exceeds
// limit: requests left later than scheduled, so the client, not the
// server, shaped the load.
func DiagnoseClientLag(p99ms float64, limit time.Duration) (Finding, bool) {
	if p99ms > ms(limit) {
		return Finding{Rule: "client-lag", Level: LevelWarn, Text: fmt.Sprintf(
			"Client lag P99 is %.1f ms (> %s): the load generator was a bottleneck and sent requests late, so the offered load was lower and smoother than asked. Give the client more CPU or run several clients.",
			p99ms, fmtMS(limit))}, true
	}
	return Finding{Rule: "client-lag", Level: LevelOK, Text: fmt.Sprintf(
		"Client lag P99 is %.2f ms (≤ %s): the load generator kept to its schedule.", p99ms, fmtMS(limit))}, true
}

// DiagnoseQueue judges queue time (router admission + engine waiting, s)
// against the mean e2e latency (s): above share the pool is saturated.
// detail says where the queue numbers came from.
func DiagnoseQueue(queue, e2e float64, detail string, share float64) (Finding, bool) {
	if !(e2e > 0) || math.IsNaN(queue) {
		return Finding{}, false
	}
	frac := queue / e2e
	f := Finding{Rule: "queue"}
	if frac > share {
		f.Level = LevelWarn
		f.Text = fmt.Sprintf("Queue time is %s of e2e (%s of %.3f s mean, > %.0f%%): the pool is saturated — add replicas or raise max_num_seqs.",
			pctText(frac), detail, e2e, 100*share)
	} else {
		f.Level = LevelOK
		f.Text = fmt.Sprintf("Queue time is %s of e2e (%s of %.3f s mean, ≤ %.0f%%): the pool is not saturated.",
			pctText(frac), detail, e2e, 100*share)
	}
	return f, true
}

// pctText writes a fraction as a percentage, with a decimal below 10%.
func pctText(frac float64) string {
	if math.Abs(frac) < 0.1 {
		return fmt.Sprintf("%.1f%%", 100*frac)
	}
	return fmt.Sprintf("%.0f%%", 100*frac)
}

// LineFit is a least-squares line y ≈ A + B·x and its R².
type LineFit struct {
	A, B, R2 float64
	N        int
}

// At is the fitted value at x.
func (f LineFit) At(x float64) float64 { return f.A + f.B*x }

// FitLine fits y ≈ a + b·x by ordinary least squares. ok is false with
// fewer than 3 points or when x does not vary. R² is 1 − SSres/SStot (1
// when y does not vary and the fit is exact).
func FitLine(xs, ys []float64) (LineFit, bool) {
	n := len(xs)
	if n != len(ys) || n < 3 {
		return LineFit{}, false
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(n)
	my /= float64(n)
	var sxx, sxy, syy float64
	for i := range xs {
		dx, dy := xs[i]-mx, ys[i]-my
		sxx += dx * dx
		sxy += dx * dy
		syy += dy * dy
	}
	if sxx == 0 {
		return LineFit{}, false
	}
	f := LineFit{B: sxy / sxx, N: n}
	f.A = my - f.B*mx
	var ssRes float64
	for i := range xs {
		r := ys[i] - f.At(xs[i])
		ssRes += r * r
	}
	f.R2 = 1
	if syy > 0 {
		f.R2 = 1 - ssRes/syy
	}
	return f, true
}

// fitE2E fits e2e latency (s) against output tokens over completed
// requests.
func fitE2E(recs []Record) (LineFit, bool) {
	var xs, ys []float64
	for i := range recs {
		if recs[i].OK() {
			xs = append(xs, float64(recs[i].OutputTokens))
			ys = append(ys, recs[i].E2E.Seconds())
		}
	}
	return FitLine(xs, ys)
}

// DiagnoseLengthFit says whether e2e latency is explained by output length
// (R² above minR2), stating the fit: a is the fixed cost (TTFT and
// overhead), b the time per output token.
func DiagnoseLengthFit(fit LineFit, minR2 float64) (Finding, bool) {
	line := fmt.Sprintf("e2e ≈ a + b·tokens with a = %.1f ms, b = %.2f ms/token, R² = %.3f over %d requests", 1000*fit.A, 1000*fit.B, fit.R2, fit.N)
	if fit.R2 > minR2 {
		return Finding{Rule: "length-fit", Level: LevelInfo, Text: "E2e is explained by output length × ITL: " + line +
			fmt.Sprintf(" (> %.2f). To cut latency, cut the time per token (smaller batches, faster GPUs) or the output length.", minR2)}, true
	}
	return Finding{Rule: "length-fit", Level: LevelInfo, Text: "E2e is not explained by output length alone: " + line +
		fmt.Sprintf(" (≤ %.2f). Requests of equal length waited differently: look at queueing, prefill of long prompts and preemption.", minR2)}, true
}

// DiagnoseCapacity states an SLO's sweep winner.
func DiagnoseCapacity(w SweepWinner) (Finding, bool) {
	if len(w.Capacities) == 0 {
		return Finding{}, false
	}
	f := Finding{Rule: "capacity", Level: LevelInfo}
	if w.Winner < 0 {
		f.Level = LevelWarn
		f.Text = fmt.Sprintf("No target met the SLO %s even at its lowest rate: sweep lower rates or relax the SLO.", w.SLO.title())
		return f, true
	}
	c := w.Capacities[w.Winner]
	f.Text = fmt.Sprintf("Under the SLO %s, %s sustains the most: %s req/s", w.SLO.title(), c.Target, rateText(c.Rate))
	tied := w.tiedWith()
	if len(tied) > 0 {
		f.Text += fmt.Sprintf(", tied on rate with %s and ahead on output tok/s", strings.Join(tied, ", "))
	} else if w.Winner > 0 && !math.IsNaN(c.VsFirst) {
		f.Text += fmt.Sprintf(", %.2f× the capacity of %s", c.VsFirst, w.Capacities[0].Target)
	}
	f.Text += "."
	return f, true
}

// DiagnoseAB lists the A/B rows whose interval excludes 0, or says the
// difference is within noise.
func DiagnoseAB(r *ABResult) (Finding, bool) {
	var sig []string
	for _, row := range r.Rows {
		if row.CI.Significant() {
			sig = append(sig, fmt.Sprintf("P%s %s %+.1f ms (%s, CI [%+.1f, %+.1f])",
				percentileLabel(row.P), abMetricName(row.Metric), row.CI.Delta, pctChange(row.CI.A, row.CI.Delta), row.CI.Lower, row.CI.Upper))
		}
	}
	if len(sig) == 0 {
		return Finding{Rule: "ab", Level: LevelInfo, Text: fmt.Sprintf(
			"A/B: no difference between %s and %s is significant at %g%%: what differs is within noise; run more requests to resolve smaller effects.",
			r.A.Label, r.B.Label, 100*r.Bootstrap.Level)}, true
	}
	return Finding{Rule: "ab", Level: LevelInfo, Text: fmt.Sprintf("A/B: %s vs %s differs significantly in %s.",
		r.B.Label, r.A.Label, strings.Join(sig, "; "))}, true
}
