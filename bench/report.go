package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// consoleWidth is vllm bench's block width.
const consoleWidth = 50

// metricTitle returns vllm bench's section header and row name of a metric.
func metricTitle(m string) (title, name string) {
	switch m {
	case MetricTTFT:
		return "Time to First Token", "TTFT"
	case MetricTPOT:
		return "Time per Output Token (excl. 1st token)", "TPOT"
	case MetricITL:
		return "Inter-token Latency", "ITL"
	default:
		return "End-to-end Latency", "E2EL"
	}
}

// center pads s with c on both sides to width, the extra character on the
// right, as Python's "{:c^n}" does.
func center(s string, c byte, width int) string {
	fill := width - len(s)
	if fill <= 0 {
		return s
	}
	left := fill / 2
	return strings.Repeat(string(c), left) + s + strings.Repeat(string(c), fill-left)
}

// consoleWriter writes vllm-style rows; the first write error sticks.
type consoleWriter struct {
	w   io.Writer
	err error
}

func (c *consoleWriter) line(s string) {
	if c.err == nil {
		_, c.err = io.WriteString(c.w, s+"\n")
	}
}

func (c *consoleWriter) int(label string, v int) { c.line(fmt.Sprintf("%-40s %-10d", label, v)) }

func (c *consoleWriter) float(label string, v float64) {
	c.line(fmt.Sprintf("%-40s %-10.2f", label, v))
}

// WriteConsole prints s the way `vllm bench serve` does (same rows, order
// and column widths), followed by gpurouter's own section: client-side
// concurrency, the load generator's lag, failures by reason and, for
// labelled requests, end-to-end latency per use case.
func WriteConsole(w io.Writer, res *Result, s *Summary) error {
	c := &consoleWriter{w: w}
	c.line(center(" Serving Benchmark Result ", '=', consoleWidth))
	c.int("Successful requests:", s.Completed)
	c.int("Failed requests:", s.Failed)
	if res.MaxConcurrency > 0 {
		c.int("Maximum request concurrency:", res.MaxConcurrency)
	}
	if !res.Timed && res.RequestRate > 0 && !math.IsInf(res.RequestRate, 1) {
		c.float("Request rate configured (RPS):", res.RequestRate)
	}
	c.float("Benchmark duration (s):", s.Duration.Seconds())
	c.int("Total input tokens:", s.TotalInput)
	c.int("Total generated tokens:", s.TotalOutput)
	c.float("Request throughput (req/s):", s.RequestThroughput)
	if s.Options.Goodput.IsSet() {
		c.float("Request goodput (req/s):", s.RequestGoodput)
	}
	c.float("Output token throughput (tok/s):", s.OutputThroughput)
	c.float("Peak output token throughput (tok/s):", s.MaxOutputTokensPerS)
	c.float("Peak concurrent requests:", float64(s.MaxConcurrentRequests))
	c.float("Total Token throughput (tok/s):", s.TotalTokenThroughput)
	for _, m := range AllMetrics() {
		if !slices.Contains(s.Options.PercentileMetrics, m) {
			continue
		}
		title, name := metricTitle(m)
		d := s.Dist(m)
		c.line(center(title, '-', consoleWidth))
		c.float("Mean "+name+" (ms):", d.Mean)
		c.float("Median "+name+" (ms):", d.Median)
		for _, p := range d.Percentiles {
			c.float("P"+percentileLabel(p.P)+" "+name+" (ms):", p.Value)
		}
	}
	c.line(strings.Repeat("=", consoleWidth))

	c.line(center(" gpurouter: client side ", '-', consoleWidth))
	c.int("Max requests in flight:", res.MaxInFlight)
	c.float("Client lag P99 (ms):", s.Lag.At(99))
	if res.MaxConcurrency > 0 {
		c.float("Mean client queue (ms):", s.ClientQueue.Mean)
	}
	reasons := make([]string, 0, len(s.FailuresByReason))
	for r := range s.FailuresByReason {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	for _, r := range reasons {
		c.int("Failed ("+r+"):", s.FailuresByReason[r])
	}
	if len(s.UseCases) > 0 {
		c.line(center("End-to-end Latency by Use Case", '-', consoleWidth))
		c.line(fmt.Sprintf("%-16s %5s %4s %7s %7s %7s", "use case", "done", "fail", "P50 ms", "P95 ms", "P99 ms"))
		for _, u := range s.UseCases {
			c.line(fmt.Sprintf("%-16s %5d %4d %7.0f %7.0f %7.0f", u.Name, u.Completed, u.Failed, u.P50, u.P95, u.P99))
		}
	}
	if len(s.Adapters) > 0 {
		c.line(center("Latency by Adapter (ms)", '-', consoleWidth))
		c.line(fmt.Sprintf("%-14s %5s %4s %6s %6s %6s %6s", "adapter", "done", "fail", "TTFT50", "TTFT99", "E2E50", "E2E99"))
		for _, a := range s.Adapters {
			c.line(fmt.Sprintf("%-14s %5d %4d %6.0f %6.0f %6.0f %6.0f", adapterLabel(a), a.Completed, a.Failed,
				a.TTFTP50, a.TTFTP99, a.E2ELP50, a.E2ELP99))
		}
	}
	c.line(strings.Repeat("=", consoleWidth))
	return c.err
}

// adapterLabel names an adapter row: the others bucket says how many it
// holds; a long name is cut to fit the column.
func adapterLabel(a AdapterSummary) string {
	if a.Name == OthersAdapter && a.Adapters > 1 {
		return fmt.Sprintf("others (%d)", a.Adapters)
	}
	if len(a.Name) > 14 {
		return a.Name[:13] + "~"
	}
	return a.Name
}
