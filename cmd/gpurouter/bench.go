package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/gpurouter/gpurouter/bench"
)

// benchList is a repeatable string flag.
type benchList []string

func (l *benchList) String() string     { return strings.Join(*l, " ") }
func (l *benchList) Set(v string) error { *l = append(*l, v); return nil }

// benchProfile is a --profile preset: flag defaults for a workload of
// calibration.md (row C, and row A for "mixed"). Flags given on the
// command line win.
type benchProfile struct {
	dataset          string
	in, out          int
	rate             float64
	numPrompts       int
	maxConcurrency   int
	ignoreEOS        bool
	percentileMetric string
}

func benchProfiles() map[string]benchProfile {
	inf := math.Inf(1)
	return map[string]benchProfile{
		"sharegpt":         {dataset: bench.DatasetShareGPT, rate: inf, numPrompts: 1000, maxConcurrency: 512, percentileMetric: "ttft,tpot,itl,e2el"},
		"throughput":       {dataset: bench.DatasetRandom, in: 1024, out: 128, rate: inf, numPrompts: 1000, maxConcurrency: 512, ignoreEOS: true},
		"long-context":     {dataset: bench.DatasetRandom, in: 32000, out: 100, rate: 1, numPrompts: 100, ignoreEOS: true, percentileMetric: "ttft,tpot,itl,e2el"},
		"generation-heavy": {dataset: bench.DatasetRandom, in: 1000, out: 2000, rate: 1, numPrompts: 200, ignoreEOS: true, percentileMetric: "ttft,tpot,itl,e2el"},
		"mixed":            {dataset: bench.DatasetUseCase, rate: inf, numPrompts: 100, maxConcurrency: 16, ignoreEOS: true, percentileMetric: "ttft,tpot,itl,e2el"},
	}
}

// expandGoodput joins vllm's multi-value form "--goodput ttft:500 tpot:50"
// into one argument, which the flag package would otherwise stop at.
func expandGoodput(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a != "--goodput" && a != "-goodput" {
			continue
		}
		var vals []string
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") && strings.Contains(args[i+1], ":") {
			i++
			vals = append(vals, args[i])
		}
		if len(vals) > 0 {
			out = append(out, strings.Join(vals, " "))
		}
	}
	return out
}

// runBench is `gpurouter bench`: one run with vllm bench serve's flags, or,
// on a first argument of "sweep" or "ab", a multi-target rate sweep or an
// A/B comparison.
func runBench(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "sweep":
			return runBenchSweep(args[1:], stdout, stderr)
		case "ab":
			return runBenchAB(args[1:], stdout, stderr)
		case "proxy-cost":
			return runBenchProxyCost(args[1:], stdout, stderr)
		}
	}
	f := newBenchFlags("bench", stderr,
		"usage: gpurouter bench [flags]   (vllm bench serve's flag names; --flag and -flag both work)\n"+
			"       gpurouter bench sweep [flags]   (gpurouter bench sweep -h)\n"+
			"       gpurouter bench ab [flags]      (gpurouter bench ab -h)\n"+
			"       gpurouter bench proxy-cost [flags]   (the data plane's CPU and memory next to HAProxy and nginx)")
	sweepRates := f.fs.String("sweep-rates", "", "run once per request rate in this comma-separated list (inf allowed) and print a Markdown SLO matrix judged on --goodput at the highest --metric-percentiles")
	var engineURLs, engineLabels benchList
	f.fs.Var(&engineURLs, "engine-url", "engine whose /metrics to scrape before and after for the engine column (repeatable); "+
		"prefill=URL or decode=URL marks a prefill/decode split's replicas: the phases of each role and the KV reads are printed, "+
		"and prefill engines (which see the router's max_tokens-1 requests, not the client's) stay out of the engine column")
	f.fs.Var(&engineLabels, "engine-label", "KEY=VALUE label filter for engine histograms, e.g. model_name=M (repeatable)")
	if !f.parse(args) {
		return 2
	}
	s, errs := f.resolve(stderr)
	if s == nil && len(errs) == 0 {
		return 1
	}
	var rates []float64
	if *sweepRates != "" {
		if f.set["request-rate"] {
			errs = append(errs, "give --request-rate or --sweep-rates, not both")
		}
		r, rerrs := parseRates("sweep-rates", *sweepRates)
		rates, errs = r, append(errs, rerrs...)
	}
	engines, roles, rerrs := splitEngineRoles(engineURLs)
	errs = append(errs, rerrs...)
	match := map[string]string{}
	for _, l := range engineLabels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			errs = append(errs, fmt.Sprintf("--engine-label %q: want KEY=VALUE", l))
			continue
		}
		match[k] = v
	}
	if len(errs) > 0 {
		return printErrors(stderr, errs)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if code := f.load(ctx, s, s.cfg.BaseURL, stderr); code != 0 {
		return code
	}
	cfg, mopts, meta, ps := s.cfg, s.mopts, s.meta, s.ps

	// Client vs router vs engine (bench_observe.go): the router through
	// GET /debug/pools and /debug/requests, engines' /metrics before/after,
	// and every second in between (KV use, prefix cache).
	obs := newObserver(cfg, engines.observed, match)
	var sampler engineSampling

	rateText := "inf"
	if !math.IsInf(cfg.RequestRate, 1) {
		rateText = fmt.Sprint(cfg.RequestRate)
	}
	switch {
	case len(rates) > 0:
		fmt.Fprintf(stdout, "Traffic request rates (sweep): %s\n", *sweepRates)
	case !cfg.Timed:
		fmt.Fprintf(stdout, "Traffic request rate: %s\n", rateText)
	}
	if cfg.Timed {
		fmt.Fprintf(stdout, "Trace replay: %d requests, time scale %v\n", len(cfg.Requests), *f.timeScale)
	} else if cfg.Burstiness == 1 {
		fmt.Fprintln(stdout, "Burstiness factor: 1.0 (Poisson process)")
	} else {
		fmt.Fprintf(stdout, "Burstiness factor: %v (Gamma distribution)\n", cfg.Burstiness)
	}
	if cfg.MaxConcurrency > 0 {
		fmt.Fprintf(stdout, "Maximum request concurrency: %d\n", cfg.MaxConcurrency)
	} else {
		fmt.Fprintln(stdout, "Maximum request concurrency: None")
	}

	if len(rates) > 0 {
		return runSweep(ctx, cfg, rates, mopts, meta, *f.saveResult, *f.resultDir, *f.report, stdout, stderr)
	}
	if len(cfg.MoreBaseURLs) > 0 {
		// Each router saw only its share of the run: its records and
		// histograms cannot stand for the whole of it.
		fmt.Fprintf(stderr, "bench: %d base URLs: no router or engine column (each router saw 1/%d of the run)\n", 1+len(cfg.MoreBaseURLs), 1+len(cfg.MoreBaseURLs))
		obs = nil
	} else {
		cfg.OnMeasureStart = func(ctx context.Context) {
			_ = obs.Before(ctx)
			sampler.start(ctx, append(obs.EngineMetricsURLs(), engines.prefill...))
		}
	}
	res, runErr := bench.Run(ctx, cfg)
	usage := sampler.stop(ctx)
	if res == nil {
		fmt.Fprintln(stderr, "bench:", runErr)
		return 1
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "bench: interrupted (%v): results cover the %d requests sent\n", runErr, len(res.Records))
	}
	sum := bench.Summarize(res, mopts)
	if err := bench.WriteConsole(stdout, res, sum); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	side := serverSide{extra: map[string]any{}}
	if obs != nil {
		var err error
		if side, err = observeAfter(ctx, obs, res, sum, ps, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
	}
	extra := side.extra
	for k, v := range s.datasetExtra {
		extra[k] = v
	}
	if engineUsageRead(usage) {
		printEngineUsage(stdout, usage)
		extra["gpurouter_engine_usage"] = bench.EngineUsageJSON(usage)
	}
	if ph := bench.NewPDPhases(usage, roles); ph != nil {
		if err := bench.WritePDPhases(stdout, ph); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		extra["gpurouter_pd_phases"] = ph.JSON()
	}
	swaps := bench.TotalLoRASwaps(usage, len(res.Records))
	if swaps != nil {
		printLoRASwaps(stdout, swaps, extra)
	}
	if fl, ok := loraSwapFloor(res.Records, usage, s.adapters); ok {
		printLoRASwapFloor(stdout, fl, extra)
	}
	if *f.saveResult {
		name := *f.resultFilename
		if name == "" {
			name = bench.DefaultResultFilename(res, *f.label)
		}
		path := filepath.Join(*f.resultDir, name)
		meta.Extra = extra
		if err := saveResultFile(path, res, sum, meta); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		fmt.Fprintf(stderr, "bench: saved %s\n", path)
	}
	if *f.report != "" {
		in := bench.ReportInput{Notes: []string{runNote(meta, cfg)}, Result: res, Summary: sum,
			Router: side.router, Engine: side.engine, RouterMatch: side.match, Breakdown: side.breakdown, LoRASwaps: swaps}
		if code := writeReport(*f.report, in, stderr); code != 0 {
			return code
		}
	}
	switch {
	case runErr != nil:
		return 1
	case sum.Completed == 0:
		fmt.Fprintln(stderr, "bench: every request failed")
		return 1
	}
	return 0
}

// runNote describes the workload in one line for a report.
func runNote(meta bench.JSONMeta, cfg bench.Config) string {
	return fmt.Sprintf("Workload: dataset %s, %d requests, seed %d, model %s.", meta.Dataset, len(cfg.Requests), cfg.Seed, cfg.Model)
}

// writeReport writes a report directory and says where; 1 on failure.
func writeReport(dir string, in bench.ReportInput, stderr io.Writer) int {
	if err := bench.WriteReport(dir, in); err != nil {
		fmt.Fprintln(stderr, "bench: report:", err)
		return 1
	}
	fmt.Fprintf(stderr, "bench: report written to %s\n", filepath.Join(dir, bench.ReportFile))
	return 0
}

// runSweep runs cfg at each rate, printing each point's result block, then
// the SLO matrix as Markdown, and writes a report when reportDir is set.
func runSweep(ctx context.Context, cfg bench.Config, rates []float64, mopts bench.MetricOptions, meta bench.JSONMeta, save bool, dir, reportDir string, stdout, stderr io.Writer) int {
	p := slices.Max(mopts.Percentiles)
	var slos []bench.NamedSLO
	if mopts.Goodput.IsSet() {
		slos = append(slos, bench.NamedSLO{SLO: mopts.Goodput})
	}
	var saveErr error
	points, err := bench.Sweep(ctx, bench.SweepConfig{
		Base: cfg, Rates: rates, Metrics: mopts, SLOs: slos, SLOPercentile: p,
		OnPoint: func(pt bench.SweepPoint) {
			fmt.Fprintf(stdout, "\nRequest rate: %v\n", pt.Rate)
			if err := bench.WriteConsole(stdout, pt.Result, pt.Summary); err != nil {
				saveErr = errors.Join(saveErr, err)
			}
			if save {
				path := filepath.Join(dir, bench.DefaultResultFilename(pt.Result, meta.Label))
				if err := saveResultFile(path, pt.Result, pt.Summary, meta); err != nil {
					saveErr = errors.Join(saveErr, err)
				} else {
					fmt.Fprintf(stderr, "bench: saved %s\n", path)
				}
			}
		},
	})
	fmt.Fprintln(stdout)
	if werr := bench.WriteSweepMarkdown(stdout, points, slos, p); werr != nil {
		saveErr = errors.Join(saveErr, werr)
	}
	if reportDir != "" && len(points) > 0 {
		in := bench.ReportInput{Title: "gpurouter rate sweep", Notes: []string{runNote(meta, cfg)},
			Sweeps: []bench.TargetSweep{{Target: cfg.BaseURL, Points: points}}, SLOs: slos, SLOPercentile: p}
		if code := writeReport(reportDir, in, stderr); code != 0 {
			saveErr = errors.Join(saveErr, errors.New("report not written"))
		}
	}
	if err := errors.Join(err, saveErr); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	return 0
}

func saveResultFile(path string, res *bench.Result, sum *bench.Summary, meta bench.JSONMeta) error {
	if dir := filepath.Dir(path); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bench.WriteJSON(f, res, sum, meta); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
