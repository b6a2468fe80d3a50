package bench

import (
	"context"
	"fmt"
	"io"
	"math"
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
}

// SweepPoint is one rate's outcome.
type SweepPoint struct {
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
		res, err := Run(ctx, cfg)
		if res == nil {
			return points, err
		}
		sp := SweepPoint{Rate: rate, Result: res, Summary: Summarize(res, c.Metrics)}
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
