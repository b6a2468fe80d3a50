package bench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ReportFile is the Markdown file WriteReport writes in its directory.
const ReportFile = "report.md"

// ReportInput is everything a report can show. Every field is optional: a
// report has the sections its inputs allow (a lone sweep, a lone A/B, one
// run with or without server columns), and the diagnosis applies the rules
// whose numbers are there.
type ReportInput struct {
	// Title heads the report; "" means "gpurouter benchmark report".
	Title string
	// Notes are lines printed under the title (the command, the fleet).
	Notes []string

	// Result is the main run: the run, summary, latency, plot and use-case
	// sections, and the e2e-vs-length fit.
	Result *Result
	// Summary is Result's summary; nil means Summarize(Result) with the
	// default options.
	Summary *Summary
	// Router and Engine are the same run seen by the router and by the
	// engines (histogram deltas, e.g. from ColumnFromSnapshots); nil when
	// not measured. Their ITL medians and queue rows feed the diagnosis.
	Router, Engine *HistogramColumn
	// RouterMatch is the run's requests joined to the router's records: the
	// router-itl rule compares client and router gaps request by request.
	RouterMatch *RouterMatch
	// Percentiles are the comparison table's; nil means 50, 99.
	Percentiles []float64
	// Breakdown splits the mean e2e latency into parts (time allocation).
	Breakdown *LatencyBreakdown
	// LoRASwaps are the engines' LoRA adapter swaps over the run; nil
	// when not measured.
	LoRASwaps *LoRASwaps

	// Sweeps are rate sweeps, one per target; SLOs their verdict columns,
	// judged at SLOPercentile (0 means 99). Each point's Verdicts must
	// follow SLOs.
	Sweeps        []TargetSweep
	SLOs          []NamedSLO
	SLOPercentile float64

	// AB is an A/B comparison.
	AB *ABResult

	// Thresholds tune the diagnosis; zero means the defaults.
	Thresholds DiagnosisThresholds
}

// LatencyBreakdown is where the mean request's end-to-end time went:
// consecutive parts in the order a request meets them, in seconds, usually
// ending with a residual (what the measured parts do not explain).
type LatencyBreakdown struct {
	// Components are the parts, in display order.
	Components []BreakdownComponent
	// Total is the mean e2e latency (s) the parts divide; 0 means their
	// sum.
	Total float64
}

// BreakdownComponent is one part of a LatencyBreakdown.
type BreakdownComponent struct {
	// Name labels the part, e.g. "router queue", "engine queue", "prefill",
	// "decode", "residual".
	Name string
	// Seconds is the part's mean per request; a residual may be negative.
	// NaN marks a part that was not measured: it prints as "-" and counts
	// as 0.
	Seconds float64
	// Queue marks waiting time (router admission, engine waiting queue):
	// the saturation diagnosis adds these up.
	Queue bool
}

// ResidualComponent names the part NewLatencyBreakdown adds.
const ResidualComponent = "residual"

// NewLatencyBreakdown builds a breakdown of total (s) from parts and adds
// the residual total − Σparts (measured parts only) as the last component.
func NewLatencyBreakdown(total float64, parts ...BreakdownComponent) *LatencyBreakdown {
	b := &LatencyBreakdown{Components: append([]BreakdownComponent(nil), parts...), Total: total}
	var sum float64
	for _, p := range parts {
		sum += nanToZero(p.Seconds)
	}
	b.Components = append(b.Components, BreakdownComponent{Name: ResidualComponent, Seconds: total - sum})
	return b
}

func (b *LatencyBreakdown) total() float64 {
	if b.Total != 0 {
		return b.Total
	}
	var sum float64
	for _, c := range b.Components {
		sum += nanToZero(c.Seconds)
	}
	return sum
}

// nanToZero is v, or 0 for NaN (a part that was not measured).
func nanToZero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}

// summary is in.Summary, computed from in.Result when missing.
func (in *ReportInput) summary() *Summary {
	if in.Summary == nil && in.Result != nil {
		in.Summary = Summarize(in.Result, MetricOptions{Percentiles: reportPercentiles()})
	}
	return in.Summary
}

// queueShare finds queue time and the mean e2e latency (s): from the
// breakdown's queue parts when it has any, else from the router's and
// engine's queue histograms against the client's mean e2e.
func (in *ReportInput) queueShare() (queue, e2e float64, detail string, ok bool) {
	if b := in.Breakdown; b != nil {
		var parts []string
		for _, c := range b.Components {
			if c.Queue && !math.IsNaN(c.Seconds) {
				queue += c.Seconds
				parts = append(parts, fmt.Sprintf("%s %.3f s", c.Name, c.Seconds))
			}
		}
		if len(parts) > 0 {
			return queue, b.total(), strings.Join(parts, " + "), true
		}
	}
	s := in.summary()
	if s == nil || s.E2EL.Count == 0 {
		return 0, 0, "", false
	}
	var parts []string
	for _, col := range []*HistogramColumn{in.Router, in.Engine} {
		if col == nil {
			continue
		}
		if h, found := col.Rows[RowQueue]; found && h.Count > 0 {
			queue += h.Mean()
			parts = append(parts, fmt.Sprintf("%s queue %.3f s", col.Name, h.Mean()))
		}
	}
	if len(parts) == 0 {
		return 0, 0, "", false
	}
	return queue, s.E2EL.Mean / 1000, strings.Join(parts, " + "), true
}

// WriteReport writes dir/report.md and its PNG plots, creating dir. A plot
// without data is left out; a plot that fails is left out too and its
// error returned (joined), after the Markdown is written.
func WriteReport(dir string, in ReportInput) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	plots, plotErr := writePlots(dir, &in)
	f, err := os.Create(filepath.Join(dir, ReportFile))
	if err != nil {
		return errors.Join(err, plotErr)
	}
	err = WriteReportMarkdown(f, in, plots)
	return errors.Join(err, f.Close(), plotErr)
}

// writePlots renders every plot in's data allows.
func writePlots(dir string, in *ReportInput) ([]PlotFile, error) {
	var plots []PlotFile
	var errs []error
	try := func(name, title string, err error) {
		switch {
		case err == nil:
			plots = append(plots, PlotFile{Name: name, Title: title})
		case !errors.Is(err, errNoData):
			errs = append(errs, fmt.Errorf("plot %s: %w", name, err))
		}
	}
	if s := in.summary(); s != nil {
		try(PlotPercentiles, "TTFT and e2e latency: percentiles and CDF", plotPercentiles(dir, s))
		try(PlotUseCases, "End-to-end latency by use case", plotUseCases(dir, s.UseCases))
	}
	if in.Result != nil {
		var fit *LineFit
		if f, ok := fitE2E(in.Result.Records); ok {
			fit = &f
		}
		try(PlotLatencyVsOutput, "End-to-end latency vs output tokens", plotLatencyVsOutput(dir, in.Result.Records, fit))
	}
	try(PlotBreakdown, "Time allocation of the mean request", plotBreakdown(dir, in.Breakdown))
	if len(in.Sweeps) > 0 {
		try(PlotThroughput, "Output throughput vs offered rate", plotThroughput(dir, in.Sweeps))
		for k, slo := range in.SLOs {
			try(plotSLOMatrix(k), "SLO compliance: "+slo.title(), plotSLOHeatmap(dir, in.Sweeps, slo, k))
		}
	}
	return plots, errors.Join(errs...)
}

// WriteReportMarkdown writes the report's Markdown, linking the plots
// listed (file names relative to the report).
func WriteReportMarkdown(w io.Writer, in ReportInput, plots []PlotFile) error {
	var b strings.Builder
	title := in.Title
	if title == "" {
		title = "gpurouter benchmark report"
	}
	b.WriteString("# " + title + "\n\n")
	for _, n := range in.Notes {
		b.WriteString(n + "\n\n")
	}
	img := func(name string) {
		for _, p := range plots {
			if p.Name == name {
				fmt.Fprintf(&b, "![%s](%s)\n\n", p.Title, p.Name)
			}
		}
	}
	s := in.summary()
	if in.Result != nil {
		writeRunSection(&b, in.Result)
	}
	if s != nil {
		writeSummarySection(&b, s)
		img(PlotPercentiles)
		img(PlotLatencyVsOutput)
	}
	if s != nil && (in.Router != nil || in.Engine != nil) {
		writeColumnsSection(&b, s, in.Percentiles, in.Router, in.Engine)
	}
	if in.Breakdown != nil && len(in.Breakdown.Components) > 0 {
		writeBreakdownSection(&b, in.Breakdown)
		img(PlotBreakdown)
	}
	if s != nil && len(s.UseCases) > 0 {
		b.WriteString("## Latency by use case\n\n| use case | completed | failed | mean output tokens | P50 e2e (ms) | P95 e2e (ms) | P99 e2e (ms) |\n|---|---|---|---|---|---|---|\n")
		for _, u := range s.UseCases {
			fmt.Fprintf(&b, "| %s | %d | %d | %.1f | %.1f | %.1f | %.1f |\n", mdEscape(u.Name), u.Completed, u.Failed, u.MeanOutputTokens, u.P50, u.P95, u.P99)
		}
		b.WriteString("\n")
		img(PlotUseCases)
	}
	if s != nil && len(s.Adapters) > 0 {
		b.WriteString("## Latency by adapter\n\n| adapter | requests | completed | failed | P50 TTFT (ms) | P99 TTFT (ms) | P50 e2e (ms) | P99 e2e (ms) |\n|---|---|---|---|---|---|---|---|\n")
		for _, a := range s.Adapters {
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %.1f | %.1f | %.1f | %.1f |\n", mdEscape(adapterLabel(AdapterSummary{Name: a.Name, Adapters: a.Adapters})),
				a.Requests, a.Completed, a.Failed, a.TTFTP50, a.TTFTP99, a.E2ELP50, a.E2ELP99)
		}
		b.WriteString("\n")
	}
	if sw := in.LoRASwaps; sw != nil {
		fmt.Fprintf(&b, "LoRA swaps on the engines over the run: %.0f from the CPU cache, %.0f from disk — %.1f per 1,000 requests.\n\n",
			sw.CPU, sw.Disk, sw.PerKiloRequests())
	}
	if len(in.Sweeps) > 0 {
		b.WriteString("## Rate sweep\n\n")
		if err := WriteSweepComparison(&b, in.Sweeps, in.SLOs, in.SLOPercentile); err != nil {
			return err
		}
		b.WriteString("\n")
		img(PlotThroughput)
		for k := range in.SLOs {
			img(plotSLOMatrix(k))
		}
	}
	if in.AB != nil {
		b.WriteString("## A/B comparison\n\n")
		if err := WriteABMarkdown(&b, in.AB); err != nil {
			return err
		}
		b.WriteString("\n")
	}
	b.WriteString("## Diagnosis\n\n")
	th := in.Thresholds.withDefaults()
	fmt.Fprintf(&b, "Thresholds: queue > %.0f%% of mean e2e; fit R² > %.2f; failures > %.0f%%; client lag P99 > %s.\n\n",
		100*th.QueueShare, th.FitR2, 100*th.FailureRate, fmtMS(th.ClientLagP99))
	findings := Diagnose(in)
	if len(findings) == 0 {
		b.WriteString("Nothing to diagnose: the report has no measurements.\n")
	}
	for _, f := range findings {
		fmt.Fprintf(&b, "- **%s** (%s): %s\n", strings.ToUpper(f.Level), f.Rule, f.Text)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeRunSection(b *strings.Builder, r *Result) {
	b.WriteString("## Run\n\n| | |\n|---|---|\n")
	fmt.Fprintf(b, "| target | %s%s |\n", mdEscape(r.BaseURL), mdEscape(r.Endpoint))
	fmt.Fprintf(b, "| model | %s |\n", mdEscape(r.Model))
	switch {
	case r.Timed:
		b.WriteString("| arrivals | trace replay |\n")
	default:
		burst := r.Burstiness
		if burst == 0 {
			burst = 1
		}
		fmt.Fprintf(b, "| request rate (req/s) | %s (burstiness %g) |\n", rateText(r.RequestRate), burst)
	}
	conc := "none"
	if r.MaxConcurrency > 0 {
		conc = fmt.Sprint(r.MaxConcurrency)
	}
	fmt.Fprintf(b, "| max concurrency | %s |\n", conc)
	if !r.Start.IsZero() {
		fmt.Fprintf(b, "| started | %s |\n", r.Start.UTC().Format(time.DateTime+" UTC"))
	}
	fmt.Fprintf(b, "| duration (s) | %.2f |\n| requests sent | %d (+%d warm-up) |\n\n", r.Duration.Seconds(), len(r.Records), len(r.Warmups))
}

func writeSummarySection(b *strings.Builder, s *Summary) {
	b.WriteString("## Summary\n\n| | |\n|---|---|\n")
	fmt.Fprintf(b, "| completed / failed | %d / %d |\n", s.Completed, s.Failed)
	fmt.Fprintf(b, "| request throughput (req/s) | %.2f |\n", s.RequestThroughput)
	if s.Options.Goodput.IsSet() {
		fmt.Fprintf(b, "| request goodput (req/s, %s) | %.2f |\n", NamedSLO{SLO: s.Options.Goodput}.title(), s.RequestGoodput)
	}
	fmt.Fprintf(b, "| output throughput (tok/s) | %.1f |\n", s.OutputThroughput)
	fmt.Fprintf(b, "| total token throughput (tok/s) | %.1f |\n", s.TotalTokenThroughput)
	fmt.Fprintf(b, "| peak output throughput (tok/s) | %.0f |\n", s.MaxOutputTokensPerS)
	fmt.Fprintf(b, "| peak concurrent requests | %d |\n", s.MaxConcurrentRequests)
	fmt.Fprintf(b, "| input / output tokens | %d / %d |\n", s.TotalInput, s.TotalOutput)
	fmt.Fprintf(b, "| client lag P99 (ms) | %.2f |\n\n", s.Lag.At(99))

	b.WriteString("### Latency (ms)\n\n| metric | count | mean | P50 | P90 | P95 | P99 | max |\n|---|---|---|---|---|---|---|---|\n")
	for _, m := range AllMetrics() {
		_, name := metricTitle(m)
		d := s.Dist(m)
		fmt.Fprintf(b, "| %s | %d | %.2f", name, d.Count, d.Mean)
		for _, p := range reportPercentiles() {
			fmt.Fprintf(b, " | %.2f", d.At(p))
		}
		fmt.Fprintf(b, " | %.2f |\n", d.Max)
	}
	b.WriteString("\nTTFT = first content chunk − send; TPOT = (e2e − TTFT)/(output tokens − 1), per request with > 1 token; " +
		"ITL = every gap between content chunks, pooled; E2EL = last content chunk − send (the definitions of vllm bench serve).\n\n")
}

func writeColumnsSection(b *strings.Builder, s *Summary, ps []float64, cols ...*HistogramColumn) {
	if ps == nil {
		ps = []float64{50, 99}
	}
	var present []HistogramColumn
	for _, c := range cols {
		if c != nil {
			present = append(present, *c)
		}
	}
	b.WriteString("## Client vs server latency (ms)\n\n" +
		"Server columns are histogram deltas over the run: means are exact (_sum/_count); a percentile is a histogram_quantile estimate followed by the bucket that holds it (\"v [a–b]\") only where the bucket is narrow (b ≤ 1.5a); " +
		"in a wider bucket only the bucket is printed (\"[a–b]\"), in the first bucket only its bound (\"≤ b\"): a number interpolated there would be invented. " +
		"Rows the router measures with its sketches (ITL and queue, from /debug/latency) are exact to 0.5%, printed without a bucket.\n\n")
	b.WriteString("| metric | stat | client |")
	for _, c := range present {
		b.WriteString(" " + mdEscape(c.Name) + " |")
	}
	b.WriteString("\n|---|---|---|" + strings.Repeat("---|", len(present)) + "\n")
	for _, row := range ComparisonRows() {
		var client *Dist
		if row != RowQueue {
			d := s.Dist(row)
			client = &d
		}
		for _, p := range append([]float64{-1}, ps...) {
			label := "mean"
			if p >= 0 {
				label = "P" + percentileLabel(p)
			}
			fmt.Fprintf(b, "| %s | %s | %s |", strings.ToUpper(row), label, clientCell(client, p))
			for _, c := range present {
				b.WriteString(" " + histCell(c, row, p) + " |")
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n")
}

func writeBreakdownSection(b *strings.Builder, bd *LatencyBreakdown) {
	total := bd.total()
	b.WriteString("## Time allocation\n\nWhere the mean request's end-to-end time went.\n\n| component | mean (s) | share of e2e |\n|---|---|---|\n")
	for _, c := range bd.Components {
		share := "-"
		if total > 0 {
			share = fmt.Sprintf("%.1f%%", 100*c.Seconds/total)
		}
		name := mdEscape(c.Name)
		if c.Queue {
			name += " (queue)"
		}
		if math.IsNaN(c.Seconds) {
			fmt.Fprintf(b, "| %s | - | - |\n", name)
			continue
		}
		fmt.Fprintf(b, "| %s | %.3f | %s |\n", name, c.Seconds, share)
	}
	fmt.Fprintf(b, "| **mean e2e** | %.3f | 100%% |\n\n", total)
	for _, c := range bd.Components {
		if c.Name == ResidualComponent && c.Seconds < 0 {
			b.WriteString("The residual is negative: the measured parts overlap or come from different requests (e.g. engine histograms covering other traffic).\n\n")
		}
	}
}
