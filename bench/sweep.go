package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// NamedSLO is one column of a sweep's SLO matrix.
type NamedSLO struct {
	// Name heads the column; "" means the SLO written out ("TTFT≤500ms TPOT≤50ms").
	Name string
	SLO  SLO
}

func (n NamedSLO) title() string {
	if n.Name != "" {
		return n.Name
	}
	var parts []string
	if n.SLO.TTFT > 0 {
		parts = append(parts, "TTFT≤"+fmtMS(n.SLO.TTFT))
	}
	if n.SLO.TPOT > 0 {
		parts = append(parts, "TPOT≤"+fmtMS(n.SLO.TPOT))
	}
	if n.SLO.E2EL > 0 {
		parts = append(parts, "E2EL≤"+fmtMS(n.SLO.E2EL))
	}
	return strings.Join(parts, " ")
}

func fmtMS(d time.Duration) string {
	return fmt.Sprintf("%gms", float64(d)/float64(time.Millisecond))
}

// SweepConfig runs one workload at several request rates. The zero value
// has no rates and sweeps nothing.
type SweepConfig struct {
	// Base is the run at every point; its RequestRate is replaced.
	Base Config
	// Rates are the request rates in req/s, in run order (+Inf allowed).
	Rates []float64
	// Metrics chooses the percentiles reported at each point.
	Metrics MetricOptions
	// SLOs are the matrix's columns.
	SLOs []NamedSLO
	// SLOPercentile is the percentile an SLO is judged on; 0 means 99.
	SLOPercentile float64
	// Cooldown is a pause between points so queues drain; 0 means none.
	Cooldown time.Duration
	// OnPoint, if set, is called after each point, e.g. to print it.
	OnPoint func(p SweepPoint)
	// Target labels every point (SweepPoint.Target); SweepTargets sets it.
	Target string
}

// SweepPoint is one rate's outcome.
type SweepPoint struct {
	// Target is the label of the server measured; "" in a one-target sweep.
	Target  string
	Rate    float64
	Result  *Result
	Summary *Summary
	// Verdicts has one entry per SweepConfig.SLOs: "PASS" or "FAIL (…)".
	Verdicts []string
}

// Sweep runs Base at each rate in turn. On ctx's end it returns the points
// finished so far with ctx's error.
func Sweep(ctx context.Context, c SweepConfig) ([]SweepPoint, error) {
	if len(c.Rates) == 0 {
		return nil, fmt.Errorf("%w: sweep without rates", ErrConfig)
	}
	p := c.SLOPercentile
	if p == 0 {
		p = 99
	}
	var points []SweepPoint
	for i, rate := range c.Rates {
		if i > 0 && c.Cooldown > 0 {
			clock := c.Base.Clock
			if clock == nil {
				clock = realClock{}
			}
			if err := clock.Sleep(ctx, c.Cooldown); err != nil {
				return points, err
			}
		}
		cfg := c.Base
		cfg.RequestRate = rate
		// A sweep varies the arrival rate: a trace contributes its request
		// lengths, not its timestamps (which would make every point alike).
		cfg.Timed = false
		res, err := Run(ctx, cfg)
		if res == nil {
			return points, err
		}
		sp := SweepPoint{Target: c.Target, Rate: rate, Result: res, Summary: Summarize(res, c.Metrics)}
		for _, slo := range c.SLOs {
			sp.Verdicts = append(sp.Verdicts, Verdict(sp.Summary, slo.SLO, p))
		}
		points = append(points, sp)
		if c.OnPoint != nil {
			c.OnPoint(sp)
		}
		if err != nil {
			return points, err
		}
	}
	return points, nil
}

// Verdict judges a run against an SLO at percentile p: "PASS", or "FAIL"
// naming every metric whose percentile is over its bound, e.g.
// "FAIL (TTFT+TPOT)". A run without completed requests fails every set
// bound.
func Verdict(s *Summary, slo SLO, p float64) string {
	var failed []string
	check := func(name string, bound time.Duration, d Dist) {
		if bound > 0 && (d.Count == 0 || d.At(p) > ms(bound)) {
			failed = append(failed, name)
		}
	}
	check("TTFT", slo.TTFT, s.TTFT)
	check("TPOT", slo.TPOT, s.TPOT)
	check("E2EL", slo.E2EL, s.E2EL)
	if len(failed) == 0 {
		return "PASS"
	}
	return "FAIL (" + strings.Join(failed, "+") + ")"
}

// WriteSweepMarkdown writes the sweep as a Markdown table: per rate the
// achieved throughput, the SLO percentile of TTFT, TPOT and E2EL, and one
// verdict column per SLO.
func WriteSweepMarkdown(w io.Writer, points []SweepPoint, slos []NamedSLO, p float64) error {
	if p == 0 {
		p = 99
	}
	pl := "P" + percentileLabel(p)
	var b strings.Builder
	head := []string{"rate (req/s)", "completed", "failed", "req/s", "output tok/s", pl + " TTFT (ms)", pl + " TPOT (ms)", pl + " E2EL (ms)", "max concurrent"}
	for _, s := range slos {
		head = append(head, "SLO "+s.title())
	}
	b.WriteString("| " + strings.Join(head, " | ") + " |\n|")
	for range head {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, pt := range points {
		s := pt.Summary
		rate := "inf"
		if !math.IsInf(pt.Rate, 1) && pt.Rate > 0 {
			rate = fmt.Sprintf("%g", pt.Rate)
		}
		cells := []string{rate, fmt.Sprint(s.Completed), fmt.Sprint(s.Failed),
			fmt.Sprintf("%.2f", s.RequestThroughput), fmt.Sprintf("%.1f", s.OutputThroughput),
			fmt.Sprintf("%.1f", s.TTFT.At(p)), fmt.Sprintf("%.1f", s.TPOT.At(p)), fmt.Sprintf("%.1f", s.E2EL.At(p)),
			fmt.Sprint(s.MaxConcurrentRequests)}
		cells = append(cells, pt.Verdicts...)
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// SweepTarget is one server a multi-target sweep measures. The zero value
// is Base's server, unlabelled.
type SweepTarget struct {
	// Label names the target in tables (e.g. "router", "direct").
	Label string
	// BaseURL replaces the sweep's Base.BaseURL; "" keeps it.
	BaseURL string
	// Headers are added to Base.Headers, replacing equal keys.
	Headers map[string]string
}

// TargetSweep is one target's sweep, its points in run order.
type TargetSweep struct {
	Target string
	Points []SweepPoint
}

// SweepTargets runs the sweep c against each target in turn, every target
// with the same requests, rates and seed. On ctx's end or a failed run it
// returns what finished with the error.
func SweepTargets(ctx context.Context, c SweepConfig, targets []SweepTarget) ([]TargetSweep, error) {
	if len(targets) == 0 {
		return nil, fmt.Errorf("%w: sweep without targets", ErrConfig)
	}
	var out []TargetSweep
	for i, t := range targets {
		if i > 0 && c.Cooldown > 0 {
			clock := c.Base.Clock
			if clock == nil {
				clock = realClock{}
			}
			if err := clock.Sleep(ctx, c.Cooldown); err != nil {
				return out, err
			}
		}
		tc := c
		tc.Target = t.Label
		if t.BaseURL != "" {
			tc.Base.BaseURL = t.BaseURL
		}
		tc.Base.Headers = make(map[string]string, len(c.Base.Headers)+len(t.Headers))
		for k, v := range c.Base.Headers {
			tc.Base.Headers[k] = v
		}
		for k, v := range t.Headers {
			tc.Base.Headers[k] = v
		}
		points, err := Sweep(ctx, tc)
		if len(points) > 0 {
			out = append(out, TargetSweep{Target: t.Label, Points: points})
		}
		if err != nil {
			return out, fmt.Errorf("target %s: %w", t.Label, err)
		}
	}
	return out, nil
}

// MaxCompliantRate returns the point of the highest rate that meets SLO
// number slo (an index into the sweep's SLOs) with every lower rate also
// meeting it: rates are taken in ascending order up to the first failure,
// so a lucky pass above a failing rate does not count. ok is false when the
// lowest rate already fails.
func MaxCompliantRate(points []SweepPoint, slo int) (best SweepPoint, ok bool) {
	sorted := slices.Clone(points)
	slices.SortStableFunc(sorted, func(a, b SweepPoint) int { return cmp.Compare(a.Rate, b.Rate) })
	for _, p := range sorted {
		if slo >= len(p.Verdicts) || p.Verdicts[slo] != "PASS" {
			break
		}
		best, ok = p, true
	}
	return best, ok
}

// Capacity is one target's best rate under one SLO.
type Capacity struct {
	Target string
	// OK is false when no rate met the SLO; the other fields are then zero.
	OK bool
	// Rate is the max SLO-compliant offered rate (req/s; +Inf possible).
	Rate float64
	// OutputThroughput is the output tok/s achieved at Rate.
	OutputThroughput float64
	// VsFirst is Rate divided by the first target's: 2 means twice the
	// capacity. NaN when either has none or either rate is +Inf.
	VsFirst float64
}

// SweepWinner is the capacity comparison of every target under one SLO.
type SweepWinner struct {
	SLO        NamedSLO
	Capacities []Capacity
	// Winner indexes Capacities: the highest Rate, ties going to the higher
	// output throughput, then to the earlier target; -1 when no target met
	// the SLO at any rate.
	Winner int
}

// tiedWith names the other targets whose max compliant rate equals the
// winner's.
func (w SweepWinner) tiedWith() []string {
	if w.Winner < 0 {
		return nil
	}
	var out []string
	for i, c := range w.Capacities {
		if i != w.Winner && c.OK && c.Rate == w.Capacities[w.Winner].Rate {
			out = append(out, c.Target)
		}
	}
	return out
}

// Winners compares the targets' max SLO-compliant rates, one entry per SLO.
func Winners(sweeps []TargetSweep, slos []NamedSLO) []SweepWinner {
	out := make([]SweepWinner, len(slos))
	for k, slo := range slos {
		w := SweepWinner{SLO: slo, Winner: -1}
		for _, ts := range sweeps {
			c := Capacity{Target: ts.Target, VsFirst: math.NaN()}
			if p, ok := MaxCompliantRate(ts.Points, k); ok {
				c.OK, c.Rate, c.OutputThroughput = true, p.Rate, p.Summary.OutputThroughput
			}
			w.Capacities = append(w.Capacities, c)
		}
		for i := range w.Capacities {
			c, first := &w.Capacities[i], w.Capacities[0]
			if c.OK && first.OK && !math.IsInf(c.Rate, 0) && !math.IsInf(first.Rate, 0) && first.Rate > 0 {
				c.VsFirst = c.Rate / first.Rate
			}
			if !c.OK {
				continue
			}
			if w.Winner < 0 {
				w.Winner = i
				continue
			}
			best := w.Capacities[w.Winner]
			if c.Rate > best.Rate || (c.Rate == best.Rate && c.OutputThroughput > best.OutputThroughput) {
				w.Winner = i
			}
		}
		out[k] = w
	}
	return out
}

// rateText writes an offered rate: "inf" for +Inf or 0 (all at once).
func rateText(r float64) string {
	if math.IsInf(r, 1) || r <= 0 {
		return "inf"
	}
	return fmt.Sprintf("%g", r)
}

// WriteSweepComparison writes a multi-target sweep as Markdown: one row per
// target and rate (P TTFT, P TPOT, P E2EL, output tok/s, max concurrent,
// where P is the SLO percentile p, 0 meaning 99), then per SLO the
// compliance matrix (rates × targets), and the capacity table naming the
// winner against the first target.
func WriteSweepComparison(w io.Writer, sweeps []TargetSweep, slos []NamedSLO, p float64) error {
	if p == 0 {
		p = 99
	}
	pl := "P" + percentileLabel(p)
	var b strings.Builder
	fmt.Fprintf(&b, "| target | rate (req/s) | completed | failed | req/s | output tok/s | %s TTFT (ms) | %s TPOT (ms) | %s E2EL (ms) | max concurrent |\n", pl, pl, pl)
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, ts := range sweeps {
		for _, pt := range ts.Points {
			s := pt.Summary
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %.2f | %.1f | %.1f | %.1f | %.1f | %d |\n",
				mdEscape(ts.Target), rateText(pt.Rate), s.Completed, s.Failed, s.RequestThroughput, s.OutputThroughput,
				s.TTFT.At(p), s.TPOT.At(p), s.E2EL.At(p), s.MaxConcurrentRequests)
		}
	}
	var rates []float64
	for _, ts := range sweeps {
		for _, pt := range ts.Points {
			if !slices.Contains(rates, pt.Rate) {
				rates = append(rates, pt.Rate)
			}
		}
	}
	slices.Sort(rates)
	for k, slo := range slos {
		fmt.Fprintf(&b, "\n**SLO compliance: %s (judged at %s)**\n\n| rate (req/s) |", mdEscape(slo.title()), pl)
		for _, ts := range sweeps {
			b.WriteString(" " + mdEscape(ts.Target) + " |")
		}
		b.WriteString("\n|---|" + strings.Repeat("---|", len(sweeps)) + "\n")
		for _, r := range rates {
			b.WriteString("| " + rateText(r) + " |")
			for _, ts := range sweeps {
				cell := "-"
				for _, pt := range ts.Points {
					if pt.Rate == r && k < len(pt.Verdicts) {
						cell = pt.Verdicts[k]
						break
					}
				}
				b.WriteString(" " + cell + " |")
			}
			b.WriteString("\n")
		}
	}
	if len(sweeps) > 0 {
		for _, win := range Winners(sweeps, slos) {
			writeWinner(&b, win, sweeps[0].Target)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeWinner(b *strings.Builder, win SweepWinner, first string) {
	fmt.Fprintf(b, "\n**Max SLO-compliant rate: %s**\n\n| target | max compliant rate (req/s) | output tok/s there | capacity vs %s |\n|---|---|---|---|\n",
		mdEscape(win.SLO.title()), mdEscape(first))
	for _, c := range win.Capacities {
		if !c.OK {
			fmt.Fprintf(b, "| %s | none | - | - |\n", mdEscape(c.Target))
			continue
		}
		vs := "-"
		if !math.IsNaN(c.VsFirst) {
			vs = fmt.Sprintf("%.2f×", c.VsFirst)
		}
		fmt.Fprintf(b, "| %s | %s | %.1f | %s |\n", mdEscape(c.Target), rateText(c.Rate), c.OutputThroughput, vs)
	}
	if win.Winner < 0 {
		b.WriteString("\nWinner: none — no target met the SLO at its lowest rate.\n")
		return
	}
	c := win.Capacities[win.Winner]
	fmt.Fprintf(b, "\nWinner: **%s** at %s req/s", mdEscape(c.Target), rateText(c.Rate))
	if win.Winner > 0 && !math.IsNaN(c.VsFirst) {
		fmt.Fprintf(b, " (%.2f× the capacity of %s)", c.VsFirst, mdEscape(first))
	}
	if tied := win.tiedWith(); len(tied) > 0 {
		fmt.Fprintf(b, "; tied on rate with %s, ahead on output tok/s", mdEscape(strings.Join(tied, ", ")))
	}
	b.WriteString(".\n")
}
