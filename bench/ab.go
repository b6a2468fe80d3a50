package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// DefaultArmHeader is the header a gpurouter reads to pick a policy arm
// for one request (`gpurouter bench ab --arms a,b`).
const DefaultArmHeader = "X-Gpurouter-Policy"

// ABSide is one side of an A/B run: a target, and headers that select a
// treatment there (e.g. DefaultArmHeader: ARM). The zero value runs
// against ABConfig.Base unchanged, labelled "A" or "B".
type ABSide struct {
	// Label names the side in tables; "" means "A" or "B".
	Label string
	// BaseURL replaces Base.BaseURL; "" keeps it (one router, two arms).
	BaseURL string
	// Headers are added to Base.Headers, replacing equal keys.
	Headers map[string]string
}

// ABConfig runs the same workload against two sides, one after the other:
// the same requests, and (from Base.Seed, or the requests' own arrivals
// when Base.Timed) the same arrival schedule.
type ABConfig struct {
	// Base is the workload. Each side's run is Base with that side's
	// BaseURL and Headers, and its label added to the request ID prefix.
	Base Config
	A, B ABSide
	// Metrics chooses what each side's Summary reports.
	Metrics MetricOptions
	// Percentiles are compared for TTFT, TPOT and E2EL; nil means 50, 99.
	Percentiles []float64
	// Bootstrap configures the confidence intervals of the differences.
	Bootstrap BootstrapOptions
	// Cooldown is a pause between the two sides so queues drain; 0 means
	// none.
	Cooldown time.Duration
	// OnSide, if set, is called after each side's run, e.g. to print it.
	OnSide func(arm ABArm)
}

// ABArm is one side's measurements.
type ABArm struct {
	Label   string
	Result  *Result
	Summary *Summary
}

// ABRow is one compared statistic: metric (MetricTTFT, MetricTPOT or
// MetricE2EL) at percentile P, in ms, with the bootstrap interval of B − A.
// A zero CI.Resamples means there was nothing to compare (no values on a
// side).
type ABRow struct {
	Metric string
	P      float64
	CI     DiffCI
}

// ABResult is an A/B comparison: both sides and, per statistic, the
// difference B − A with its confidence interval.
type ABResult struct {
	A, B ABArm
	Rows []ABRow
	// Paired says the bootstrap resampled requests jointly (both sides sent
	// the same request sequence).
	Paired bool
	// Bootstrap is the effective configuration (defaults filled).
	Bootstrap BootstrapOptions
}

// RunAB runs side A, then side B, and compares them. On ctx's end it
// returns what was measured with ctx's error (a nil result when side A did
// not finish).
func RunAB(ctx context.Context, c ABConfig) (*ABResult, error) {
	sides := []ABSide{c.A, c.B}
	arms := make([]ABArm, 2)
	prefix := c.Base.RequestIDPrefix
	if prefix == "" {
		prefix = "bench-"
	}
	for i, side := range sides {
		label := sideLabel(side.Label, i)
		if i > 0 && c.Cooldown > 0 {
			clock := c.Base.Clock
			if clock == nil {
				clock = realClock{}
			}
			if err := clock.Sleep(ctx, c.Cooldown); err != nil {
				return nil, err
			}
		}
		cfg := c.Base
		if side.BaseURL != "" {
			cfg.BaseURL = side.BaseURL
		}
		cfg.Headers = make(map[string]string, len(c.Base.Headers)+len(side.Headers))
		for k, v := range c.Base.Headers {
			cfg.Headers[k] = v
		}
		for k, v := range side.Headers {
			cfg.Headers[k] = v
		}
		cfg.RequestIDPrefix = prefix + label + "-"
		res, err := Run(ctx, cfg)
		if res == nil {
			return nil, fmt.Errorf("A/B side %s: %w", label, err)
		}
		arms[i] = ABArm{Label: label, Result: res, Summary: Summarize(res, c.Metrics)}
		if c.OnSide != nil {
			c.OnSide(arms[i])
		}
		if err != nil {
			return nil, fmt.Errorf("A/B side %s: %w", label, err)
		}
	}
	return CompareAB(arms[0], arms[1], c.Percentiles, c.Bootstrap), nil
}

func sideLabel(l string, i int) string {
	if l != "" {
		return l
	}
	return string(rune('A' + i))
}

// ABMetrics lists the metrics an A/B comparison covers, in print order.
func ABMetrics() []string { return []string{MetricTTFT, MetricTPOT, MetricE2EL} }

// CompareAB compares two measured sides: for each of ABMetrics at each
// percentile (nil means 50, 99), the difference B − A and its bootstrap
// interval. Requests are paired by Record.Index when both sides sent the
// same number.
func CompareAB(a, b ABArm, percentiles []float64, o BootstrapOptions) *ABResult {
	if percentiles == nil {
		percentiles = []float64{50, 99}
	}
	o = o.withDefaults()
	out := &ABResult{A: a, B: b, Bootstrap: o}
	var ra, rb []Record
	if a.Result != nil {
		ra = a.Result.Records
	}
	if b.Result != nil {
		rb = b.Result.Records
	}
	out.Paired = len(ra) == len(rb)
	for _, m := range ABMetrics() {
		va, vb := recordValues(ra, m), recordValues(rb, m)
		for _, p := range percentiles {
			ci, err := BootstrapDiff(va, vb, PercentileStatistic(p), o)
			if err != nil {
				ci = DiffCI{}
			}
			out.Rows = append(out.Rows, ABRow{Metric: m, P: p, CI: ci})
		}
	}
	return out
}

// recordValues is metric m per request in ms, by Record.Index, NaN where
// the request has no value (failed, never sent, or one token for TPOT).
func recordValues(recs []Record, m string) []float64 {
	n := len(recs)
	for i := range recs {
		n = max(n, recs[i].Index+1)
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = math.NaN()
	}
	for i := range recs {
		r := &recs[i]
		if !r.OK() {
			continue
		}
		switch m {
		case MetricTTFT:
			out[r.Index] = ms(r.TTFT)
		case MetricTPOT:
			if r.OutputTokens > 1 {
				out[r.Index] = ms(r.TPOT())
			}
		case MetricE2EL:
			out[r.Index] = ms(r.E2E)
		}
	}
	return out
}

// abMetricName is a metric's short name in tables.
func abMetricName(m string) string {
	_, name := metricTitle(m)
	return name
}

// verdict describes a row for humans: whether the interval excludes 0 and,
// if so, which way B moved.
func (r ABRow) verdict() string {
	switch {
	case r.CI.Resamples == 0:
		return "no data"
	case !r.CI.Significant():
		return "not significant (CI contains 0)"
	case r.CI.Delta < 0:
		return "significant: B lower"
	default:
		return "significant: B higher"
	}
}

// WriteABMarkdown writes the comparison as Markdown: a line saying how the
// sides were run and compared, a throughput table, and the side-by-side
// latency table with deltas and confidence intervals.
func WriteABMarkdown(w io.Writer, r *ABResult) error {
	var b strings.Builder
	la, lb := r.A.Label, r.B.Label
	pairing := "independent"
	if r.Paired {
		pairing = "paired"
	}
	fmt.Fprintf(&b, "A = **%s**, B = **%s**: the same request sequence and arrival schedule, run one after the other (A first). "+
		"Intervals: %d %s bootstrap resamples of requests (seed %d), %g%% percentile interval of B − A; "+
		"a difference is significant when its interval excludes 0.\n\n",
		mdEscape(la), mdEscape(lb), r.Bootstrap.Resamples, pairing, r.Bootstrap.Seed, 100*r.Bootstrap.Level)
	if r.A.Summary != nil && r.B.Summary != nil {
		sa, sb := r.A.Summary, r.B.Summary
		fmt.Fprintf(&b, "| | %s | %s |\n|---|---|---|\n", mdEscape(la), mdEscape(lb))
		fmt.Fprintf(&b, "| completed / failed | %d / %d | %d / %d |\n", sa.Completed, sa.Failed, sb.Completed, sb.Failed)
		fmt.Fprintf(&b, "| request throughput (req/s) | %.2f | %.2f |\n", sa.RequestThroughput, sb.RequestThroughput)
		fmt.Fprintf(&b, "| output throughput (tok/s) | %.1f | %.1f |\n", sa.OutputThroughput, sb.OutputThroughput)
		fmt.Fprintf(&b, "| peak concurrent requests | %d | %d |\n\n", sa.MaxConcurrentRequests, sb.MaxConcurrentRequests)
	}
	fmt.Fprintf(&b, "| metric | %s (ms) | %s (ms) | Δ B−A (ms) | Δ %% | %g%% CI of Δ (ms) | verdict |\n", mdEscape(la), mdEscape(lb), 100*r.Bootstrap.Level)
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		name := "P" + percentileLabel(row.P) + " " + abMetricName(row.Metric)
		if row.CI.Resamples == 0 {
			fmt.Fprintf(&b, "| %s | - | - | - | - | - | %s |\n", name, row.verdict())
			continue
		}
		c := row.CI
		fmt.Fprintf(&b, "| %s | %.2f | %.2f | %+.2f | %s | [%+.2f, %+.2f] | %s |\n",
			name, c.A, c.B, c.Delta, pctChange(c.A, c.Delta), c.Lower, c.Upper, row.verdict())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// pctChange is delta relative to base as a signed percentage, "-" when base
// is 0.
func pctChange(base, delta float64) string {
	if base == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.1f%%", 100*delta/base)
}

// mdEscape makes s safe inside a Markdown table cell.
func mdEscape(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}
