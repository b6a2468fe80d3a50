package bench

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// PlotFile is one PNG a report wrote, referenced from its Markdown.
type PlotFile struct {
	// Name is the file name inside the report directory.
	Name string
	// Title is the image's alt text and caption.
	Title string
}

// Plot file names in a report directory.
const (
	PlotLatencyVsOutput = "latency_vs_output.png"
	PlotPercentiles     = "latency_percentiles.png"
	PlotBreakdown       = "time_allocation.png"
	PlotUseCases        = "use_cases.png"
	PlotThroughput      = "throughput_vs_rate.png"
)

// plotSLOMatrix is the name of SLO number k's heatmap (k from 0).
func plotSLOMatrix(k int) string { return fmt.Sprintf("slo_matrix_%d.png", k+1) }

// errNoData says a plot had nothing to draw; WriteReport skips it.
var errNoData = errors.New("bench: nothing to plot")

const plotWidth, plotHeight = 8 * vg.Inch, 5 * vg.Inch

// savePlot renders p as a PNG at path.
func savePlot(p *plot.Plot, path string, w, h vg.Length) error {
	wt, err := p.WriterTo(w, h, "png")
	if err != nil {
		return err
	}
	return writeFile(path, wt)
}

// writeFile creates path and writes wt into it.
func writeFile(path string, wt io.WriterTo) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := wt.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

// plotLatencyVsOutput scatters each completed request's e2e latency (s)
// against its output tokens, with the least-squares line when fit is set.
func plotLatencyVsOutput(dir string, recs []Record, fit *LineFit) error {
	var xys plotter.XYs
	for i := range recs {
		if recs[i].OK() {
			xys = append(xys, plotter.XY{X: float64(recs[i].OutputTokens), Y: recs[i].E2E.Seconds()})
		}
	}
	if len(xys) == 0 {
		return errNoData
	}
	p := plot.New()
	p.Title.Text = "End-to-end latency vs output length"
	p.X.Label.Text = "output tokens"
	p.Y.Label.Text = "e2e latency (s)"
	p.Add(plotter.NewGrid())
	sc, err := plotter.NewScatter(xys)
	if err != nil {
		return err
	}
	sc.GlyphStyle.Color = plotutil.Color(0)
	sc.GlyphStyle.Radius = vg.Points(2)
	p.Add(sc)
	p.Legend.Add("requests", sc)
	if fit != nil {
		xmin, xmax, _, _ := plotter.XYRange(xys)
		line, err := plotter.NewLine(plotter.XYs{{X: xmin, Y: fit.At(xmin)}, {X: xmax, Y: fit.At(xmax)}})
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(1)
		line.Width = vg.Points(2)
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("fit: %.3f s + %.2f ms/token (R²=%.2f)", fit.A, 1000*fit.B, fit.R2), line)
	}
	p.Legend.Top, p.Legend.Left = true, true
	return savePlot(p, filepath.Join(dir, PlotLatencyVsOutput), plotWidth, plotHeight)
}

// reportPercentiles are the percentiles the report's bars show.
func reportPercentiles() []float64 { return []float64{50, 90, 95, 99} }

// plotPercentiles draws, for TTFT and e2e latency, a bar per percentile
// (top row) and the empirical CDF (bottom row).
func plotPercentiles(dir string, s *Summary) error {
	if s.TTFT.Count == 0 || s.E2EL.Count == 0 {
		return errNoData
	}
	metrics := []struct {
		name string
		d    Dist
	}{{"TTFT", s.TTFT}, {"E2E latency", s.E2EL}}
	grid := [][]*plot.Plot{make([]*plot.Plot, 2), make([]*plot.Plot, 2)}
	for i, m := range metrics {
		var vals plotter.Values
		var names []string
		for _, q := range reportPercentiles() {
			vals = append(vals, m.d.At(q))
			names = append(names, "P"+percentileLabel(q))
		}
		bars, err := plotter.NewBarChart(vals, vg.Points(30))
		if err != nil {
			return err
		}
		bars.Color = plotutil.Color(i)
		bp := plot.New()
		bp.Title.Text = m.name + " percentiles"
		bp.Y.Label.Text = "ms"
		bp.Add(plotter.NewGrid(), bars)
		bp.NominalX(names...)
		grid[0][i] = bp

		cp := plot.New()
		cp.Title.Text = m.name + " CDF"
		cp.X.Label.Text = "ms"
		cp.Y.Label.Text = "fraction of requests"
		line, err := plotter.NewLine(cdfPoints(m.d))
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		cp.Add(plotter.NewGrid(), line)
		cp.Y.Min, cp.Y.Max = 0, 1
		grid[1][i] = cp
	}
	return saveGrid(grid, filepath.Join(dir, PlotPercentiles), plotWidth, 1.4*plotHeight)
}

// cdfPoints is the empirical CDF of d as a step line, at most ~2,000
// points.
func cdfPoints(d Dist) plotter.XYs {
	xs := d.sorted
	if len(xs) == 0 {
		return plotter.XYs{{X: 0, Y: 0}}
	}
	step := max(1, len(xs)/2000)
	out := plotter.XYs{{X: xs[0], Y: 0}}
	for i := 0; i < len(xs); i += step {
		out = append(out, plotter.XY{X: xs[i], Y: float64(i+1) / float64(len(xs))})
	}
	return append(out, plotter.XY{X: xs[len(xs)-1], Y: 1})
}

// saveGrid draws plots in a grid (rows of columns) into one PNG.
func saveGrid(grid [][]*plot.Plot, path string, w, h vg.Length) error {
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(grid), Cols: len(grid[0]), PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, dc)
	for j := range grid {
		for i, p := range grid[j] {
			if p != nil {
				p.Draw(canvases[j][i])
			}
		}
	}
	return writeFile(path, vgimg.PngCanvas{Canvas: img})
}

// plotBreakdown draws the time allocation of a mean request as one
// horizontal stacked bar, a segment per measured component (negative
// parts, such as an overshooting residual, drawn as 0), with the legend
// beside the plot.
func plotBreakdown(dir string, b *LatencyBreakdown) error {
	if b == nil || len(b.Components) == 0 {
		return errNoData
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Time allocation of the mean request (%.3f s)", b.total())
	p.X.Label.Text = "seconds"
	p.Add(plotter.NewGrid())
	leg := plot.NewLegend()
	var prev *plotter.BarChart
	for i, c := range b.Components {
		if math.IsNaN(c.Seconds) {
			continue
		}
		bar, err := plotter.NewBarChart(plotter.Values{max(c.Seconds, 0)}, vg.Points(50))
		if err != nil {
			return err
		}
		bar.Horizontal = true
		bar.Color = plotutil.Color(i)
		if prev != nil {
			bar.StackOn(prev)
		}
		p.Add(bar)
		leg.Add(fmt.Sprintf("%s %.3f s", c.Name, c.Seconds), bar)
		prev = bar
	}
	p.NominalY("mean request")
	leg.Top, leg.Left = true, true
	w, h, legendW := 9*vg.Inch, 0.6*plotHeight, 3.4*vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	p.Draw(draw.Crop(dc, 0, -legendW, 0, 0))
	leg.Draw(draw.Crop(dc, w-legendW+vg.Millimeter*4, 0, 0, -vg.Millimeter*8))
	return writeFile(filepath.Join(dir, PlotBreakdown), vgimg.PngCanvas{Canvas: img})
}

// plotUseCases draws grouped bars of P50, P95 and P99 e2e latency per use
// case.
func plotUseCases(dir string, ucs []UseCaseSummary) error {
	if len(ucs) == 0 {
		return errNoData
	}
	p := plot.New()
	p.Title.Text = "End-to-end latency by use case"
	p.Y.Label.Text = "seconds"
	p.Add(plotter.NewGrid())
	w := vg.Points(14)
	names := make([]string, len(ucs))
	for i, u := range ucs {
		names[i] = u.Name
	}
	for k, q := range []struct {
		name string
		get  func(UseCaseSummary) float64
	}{{"P50", func(u UseCaseSummary) float64 { return u.P50 }}, {"P95", func(u UseCaseSummary) float64 { return u.P95 }}, {"P99", func(u UseCaseSummary) float64 { return u.P99 }}} {
		vals := make(plotter.Values, len(ucs))
		for i, u := range ucs {
			vals[i] = q.get(u) / 1000
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = plotutil.Color(k)
		bars.Offset = vg.Length(k-1) * w
		p.Add(bars)
		p.Legend.Add(q.name, bars)
	}
	p.NominalX(names...)
	p.Legend.Top, p.Legend.Left = true, true
	return savePlot(p, filepath.Join(dir, PlotUseCases), plotWidth, plotHeight)
}

// plotThroughput draws output tok/s against the offered rate, a line per
// target; points at rate inf (all at once) have no x and are left out.
func plotThroughput(dir string, sweeps []TargetSweep) error {
	p := plot.New()
	p.Title.Text = "Output throughput vs offered request rate"
	p.X.Label.Text = "offered rate (req/s)"
	p.Y.Label.Text = "output tok/s"
	p.Add(plotter.NewGrid())
	drawn := false
	for i, ts := range sweeps {
		var xys plotter.XYs
		for _, pt := range ts.Points {
			if pt.Rate > 0 && !math.IsInf(pt.Rate, 0) {
				xys = append(xys, plotter.XY{X: pt.Rate, Y: pt.Summary.OutputThroughput})
			}
		}
		if len(xys) == 0 {
			continue
		}
		slices.SortFunc(xys, func(a, b plotter.XY) int { return cmpFloat(a.X, b.X) })
		line, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		line.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		p.Add(line, pts)
		name := ts.Target
		if name == "" {
			name = "target"
		}
		p.Legend.Add(name, line, pts)
		drawn = true
	}
	if !drawn {
		return errNoData
	}
	p.X.Min, p.Y.Min = 0, 0
	p.Legend.Top, p.Legend.Left = true, true
	return savePlot(p, filepath.Join(dir, PlotThroughput), plotWidth, plotHeight)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// plotSLOHeatmap draws SLO number k's compliance matrix as a heatmap: rates
// down, targets across, green PASS and red FAIL cells labelled with the
// verdict.
func plotSLOHeatmap(dir string, sweeps []TargetSweep, slo NamedSLO, k int) error {
	var rates []float64
	for _, ts := range sweeps {
		for _, pt := range ts.Points {
			if !slices.Contains(rates, pt.Rate) {
				rates = append(rates, pt.Rate)
			}
		}
	}
	if len(rates) == 0 {
		return errNoData
	}
	slices.Sort(rates)
	p := plot.New()
	p.Title.Text = "SLO compliance: " + slo.title()
	p.X.Label.Text = "target"
	p.Y.Label.Text = "offered rate (req/s)"
	var labels plotter.XYLabels
	for i, ts := range sweeps {
		for _, pt := range ts.Points {
			if k >= len(pt.Verdicts) {
				continue
			}
			j := float64(slices.Index(rates, pt.Rate))
			x := float64(i)
			cell, err := plotter.NewPolygon(plotter.XYs{{X: x - 0.5, Y: j - 0.5}, {X: x + 0.5, Y: j - 0.5}, {X: x + 0.5, Y: j + 0.5}, {X: x - 0.5, Y: j + 0.5}})
			if err != nil {
				return err
			}
			cell.Color = color.RGBA{R: 0xe5, G: 0x73, B: 0x73, A: 0xff}
			if pt.Verdicts[k] == "PASS" {
				cell.Color = color.RGBA{R: 0x81, G: 0xc7, B: 0x84, A: 0xff}
			}
			cell.LineStyle.Color = color.White
			p.Add(cell)
			labels.XYs = append(labels.XYs, plotter.XY{X: x, Y: j})
			labels.Labels = append(labels.Labels, pt.Verdicts[k])
		}
	}
	if len(labels.XYs) == 0 {
		return errNoData
	}
	lb, err := plotter.NewLabels(labels)
	if err != nil {
		return err
	}
	for i := range lb.TextStyle {
		lb.TextStyle[i].XAlign, lb.TextStyle[i].YAlign = draw.XCenter, draw.YCenter
	}
	p.Add(lb)
	names := make([]string, len(sweeps))
	for i, ts := range sweeps {
		names[i] = ts.Target
	}
	ys := make([]string, len(rates))
	for j, r := range rates {
		ys[j] = rateText(r)
	}
	p.NominalX(names...)
	p.NominalY(ys...)
	p.X.Min, p.X.Max = -0.5, float64(len(sweeps))-0.5
	p.Y.Min, p.Y.Max = -0.5, float64(len(rates))-0.5
	h := max(3*vg.Inch, vg.Length(len(rates))*0.6*vg.Inch+1.5*vg.Inch)
	return savePlot(p, filepath.Join(dir, plotSLOMatrix(k)), max(5*vg.Inch, vg.Length(len(sweeps))*2*vg.Inch+1.5*vg.Inch), h)
}
