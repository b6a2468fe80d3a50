package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpurouter/gpurouter/admission/tokens"
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

func runBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gpurouter bench [flags]   (vllm bench serve's flag names; --flag and -flag both work)")
		fs.PrintDefaults()
	}
	baseURL := fs.String("base-url", "", "server (router or engine) URL; default http://HOST:PORT")
	host := fs.String("host", "127.0.0.1", "server host when --base-url is not given")
	port := fs.Int("port", 8000, "server port when --base-url is not given")
	endpoint := fs.String("endpoint", "", "API path: /v1/completions (default) or /v1/chat/completions")
	backend := fs.String("backend", "openai", "openai (completions) or openai-chat (chat completions); sets the default --endpoint")
	model := fs.String("model", "", "model name; default: the first id of GET /v1/models")
	numPrompts := fs.Int("num-prompts", 1000, "number of requests (azure-trace: default the whole trace)")
	requestRate := fs.Float64("request-rate", math.Inf(1), "mean request rate in req/s; inf sends all at once")
	burstiness := fs.Float64("burstiness", 1, "gamma shape of inter-arrival gaps: 1 Poisson, <1 burstier, >1 more regular")
	maxConcurrency := fs.Int("max-concurrency", 0, "cap on requests in flight (0: none)")
	datasetName := fs.String("dataset-name", bench.DatasetRandom, "dataset: "+strings.Join(bench.DatasetNames(), ", "))
	datasetPath := fs.String("dataset-path", "", "dataset file (sharegpt JSON, azure-trace CSV, custom JSONL)")
	randomInputLen := fs.Int("random-input-len", 1024, "random dataset: input tokens")
	randomOutputLen := fs.Int("random-output-len", 128, "random dataset: output tokens")
	randomRangeRatio := fs.Float64("random-range-ratio", 0, "random/usecase: lengths uniform in [L(1-r), L(1+r)], 0 <= r < 1")
	sharegptOutputLen := fs.Int("sharegpt-output-len", 0, "sharegpt: fixed output length instead of the reference completion's")
	customOutputLen := fs.Int("custom-output-len", 256, "custom: output tokens of records without output_tokens")
	timeScale := fs.Float64("time-scale", 1, "azure-trace: replay speed-up; arrival offsets are divided by it (2 = twice as fast)")
	ignoreEOS := fs.Bool("ignore-eos", false, "send ignore_eos so the engine generates exactly max_tokens (default on for azure-trace and the profiles)")
	var goodput benchList
	fs.Var(&goodput, "goodput", "SLOs in ms for goodput, KEY:VALUE with keys ttft, tpot, e2el (\"ttft:500 tpot:50\"; repeatable)")
	percentileMetrics := fs.String("percentile-metrics", "ttft,tpot,itl", "metrics to print percentiles of: ttft,tpot,itl,e2el")
	metricPercentiles := fs.String("metric-percentiles", "99", "percentiles to report, e.g. 50,90,99")
	seed := fs.Uint64("seed", 0, "seed of datasets and arrivals")
	numWarmups := fs.Int("num-warmups", 0, "warm-up requests before the run, excluded from results")
	saveResult := fs.Bool("save-result", false, "write the result JSON")
	resultDir := fs.String("result-dir", "", "directory of the result JSON (default .)")
	resultFilename := fs.String("result-filename", "", "result JSON name (default like vllm: LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json)")
	label := fs.String("label", "", "label of the run in the result (default the backend)")
	profile := fs.String("profile", "", "preset: sharegpt, throughput, long-context, generation-heavy, mixed (calibration.md)")
	sweepRates := fs.String("sweep-rates", "", "run once per request rate in this comma-separated list (inf allowed) and print a Markdown SLO matrix judged on --goodput at the highest --metric-percentiles")
	var engineURLs, engineLabels, headers benchList
	fs.Var(&engineURLs, "engine-url", "engine whose /metrics to scrape before and after for the engine column (repeatable)")
	fs.Var(&engineLabels, "engine-label", "KEY=VALUE label filter for engine histograms, e.g. model_name=M (repeatable)")
	fs.Var(&headers, "header", "KEY=VALUE header added to every request (repeatable); OPENAI_API_KEY sets Authorization")
	requestTimeout := fs.Duration("request-timeout", 0, "per-request limit from send to end of stream (0: none)")
	requestIDPrefix := fs.String("request-id-prefix", "", "X-Request-Id prefix (default bench-<8 hex>-)")
	countEmpty := fs.Bool("count-empty-chunks", false, "count every chunk with choices as an output chunk, as vllm bench does (default: only chunks carrying text)")
	disableTqdm := fs.Bool("disable-tqdm", false, "no progress bar")
	tokenizer := fs.String("tokenizer", "", "accepted for vllm compatibility; gpurouter counts tokens with cl100k_base")
	if err := fs.Parse(expandGoodput(args)); err != nil {
		return 2
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "bench: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected arguments: %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *tokenizer != "" {
		fmt.Fprintln(stderr, "bench: --tokenizer ignored: prompt tokens are counted with cl100k_base")
	}

	if *profile != "" {
		p, ok := benchProfiles()[*profile]
		if !ok {
			return bad("--profile %q: want one of sharegpt, throughput, long-context, generation-heavy, mixed", *profile)
		}
		if !set["dataset-name"] {
			*datasetName = p.dataset
			if p.dataset == bench.DatasetShareGPT && *datasetPath == "" {
				*datasetName = bench.DatasetShareGPTSynthetic
			}
		}
		if !set["random-input-len"] && p.in > 0 {
			*randomInputLen = p.in
		}
		if !set["random-output-len"] && p.out > 0 {
			*randomOutputLen = p.out
		}
		if !set["request-rate"] {
			*requestRate = p.rate
		}
		if !set["num-prompts"] {
			*numPrompts = p.numPrompts
		}
		if !set["max-concurrency"] {
			*maxConcurrency = p.maxConcurrency
		}
		if !set["ignore-eos"] {
			*ignoreEOS = p.ignoreEOS
		}
		if !set["percentile-metrics"] && p.percentileMetric != "" {
			*percentileMetrics = p.percentileMetric
		}
	}
	if *datasetName == bench.DatasetAzureTrace && !set["ignore-eos"] {
		*ignoreEOS = true // a replay must generate the trace's lengths (data/README.md)
	}
	if *datasetName == bench.DatasetAzureTrace && !set["num-prompts"] {
		*numPrompts = 0 // the whole trace
	}

	// Validate every flag before touching the network.
	var errs []string
	if *baseURL == "" {
		*baseURL = fmt.Sprintf("http://%s:%d", *host, *port)
	}
	if *endpoint == "" {
		switch *backend {
		case "openai", "vllm":
			*endpoint = bench.EndpointCompletions
		case "openai-chat":
			*endpoint = bench.EndpointChat
		default:
			errs = append(errs, fmt.Sprintf("--backend %q: want openai or openai-chat", *backend))
		}
	}
	if *numPrompts < 0 || (*numPrompts == 0 && *datasetName != bench.DatasetAzureTrace) {
		errs = append(errs, fmt.Sprintf("--num-prompts %d: want at least 1", *numPrompts))
	}
	if !(*requestRate > 0) {
		errs = append(errs, fmt.Sprintf("--request-rate %v: want a positive number or inf", *requestRate))
	}
	if !(*burstiness > 0) {
		errs = append(errs, fmt.Sprintf("--burstiness %v: want a positive number", *burstiness))
	}
	if *maxConcurrency < 0 || *numWarmups < 0 || *requestTimeout < 0 {
		errs = append(errs, "--max-concurrency, --num-warmups and --request-timeout must not be negative")
	}
	if !(*timeScale > 0) || math.IsInf(*timeScale, 0) {
		errs = append(errs, fmt.Sprintf("--time-scale %v: want a positive number", *timeScale))
	}
	var rates []float64
	if *sweepRates != "" {
		if set["request-rate"] {
			errs = append(errs, "give --request-rate or --sweep-rates, not both")
		}
		for _, f := range strings.Split(*sweepRates, ",") {
			r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || !(r > 0) {
				errs = append(errs, fmt.Sprintf("--sweep-rates: %q is not a positive rate or inf", f))
				continue
			}
			rates = append(rates, r)
		}
	}
	slo, err := bench.ParseGoodput(goodput)
	if err != nil {
		errs = append(errs, "--goodput: "+strings.TrimPrefix(err.Error(), "bench: option: "))
	}
	pm, err := bench.ParsePercentileMetrics(*percentileMetrics)
	if err != nil {
		errs = append(errs, "--percentile-metrics: "+strings.TrimPrefix(err.Error(), "bench: option: "))
	}
	ps, err := bench.ParseMetricPercentiles(*metricPercentiles)
	if err != nil {
		errs = append(errs, "--metric-percentiles: "+strings.TrimPrefix(err.Error(), "bench: option: "))
	}
	hdrs := map[string]string{}
	if key := os.Getenv("OPENAI_API_KEY"); key != "" {
		hdrs["Authorization"] = "Bearer " + key
	}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			errs = append(errs, fmt.Sprintf("--header %q: want KEY=VALUE", h))
			continue
		}
		hdrs[k] = v
	}
	match := map[string]string{}
	for _, l := range engineLabels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			errs = append(errs, fmt.Sprintf("--engine-label %q: want KEY=VALUE", l))
			continue
		}
		match[k] = v
	}
	est, err := tokens.New()
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	dcfg := bench.DatasetConfig{
		Name: *datasetName, Path: *datasetPath, NumPrompts: *numPrompts, Seed: *seed,
		RandomInputLen: *randomInputLen, RandomOutputLen: *randomOutputLen, RandomRangeRatio: *randomRangeRatio,
		ShareGPTOutputLen: *sharegptOutputLen, CustomOutputLen: *customOutputLen, TimeScale: *timeScale, Estimator: est,
	}
	if err := dcfg.Validate(); err != nil {
		for _, e := range strings.Split(err.Error(), "\n") {
			errs = append(errs, strings.TrimPrefix(e, "bench: "))
		}
	}
	if len(errs) > 0 {
		for _, e := range errs {
			fmt.Fprintln(stderr, "bench:", e)
		}
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ds, err := bench.LoadDataset(dcfg)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	if *model == "" {
		if *model, err = bench.FirstModel(ctx, *baseURL, hdrs); err != nil {
			fmt.Fprintf(stderr, "bench: no --model and %v\n", err)
			return 1
		}
	}
	prefix := *requestIDPrefix
	if prefix == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		prefix = "bench-" + hex.EncodeToString(b[:]) + "-"
	}

	var scraper bench.Scraper
	metricsURLs := make([]string, len(engineURLs))
	for i, u := range engineURLs {
		metricsURLs[i] = strings.TrimRight(u, "/")
		if !strings.HasSuffix(metricsURLs[i], "/metrics") {
			metricsURLs[i] += "/metrics"
		}
	}
	var before []bench.Snapshot
	var scrapeErr error
	scrapeAll := func(ctx context.Context) []bench.Snapshot {
		snaps := make([]bench.Snapshot, len(metricsURLs))
		for i, u := range metricsURLs {
			snap, err := scraper.Scrape(ctx, u)
			if err != nil {
				scrapeErr = errors.Join(scrapeErr, err)
			}
			snaps[i] = snap
		}
		return snaps
	}

	rateText := "inf"
	if !math.IsInf(*requestRate, 1) {
		rateText = fmt.Sprint(*requestRate)
	}
	switch {
	case len(rates) > 0:
		fmt.Fprintf(stdout, "Traffic request rates (sweep): %s\n", *sweepRates)
	case !ds.Timed:
		fmt.Fprintf(stdout, "Traffic request rate: %s\n", rateText)
	}
	if ds.Timed {
		fmt.Fprintf(stdout, "Trace replay: %d requests, time scale %v\n", len(ds.Requests), *timeScale)
	} else if *burstiness == 1 {
		fmt.Fprintln(stdout, "Burstiness factor: 1.0 (Poisson process)")
	} else {
		fmt.Fprintf(stdout, "Burstiness factor: %v (Gamma distribution)\n", *burstiness)
	}
	if *maxConcurrency > 0 {
		fmt.Fprintf(stdout, "Maximum request concurrency: %d\n", *maxConcurrency)
	} else {
		fmt.Fprintln(stdout, "Maximum request concurrency: None")
	}

	var progress io.Writer
	if f, ok := stderr.(*os.File); ok && !*disableTqdm {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			progress = stderr
		}
	}
	cfg := bench.Config{
		BaseURL: *baseURL, Endpoint: *endpoint, Model: *model, Requests: ds.Requests, Timed: ds.Timed,
		RequestRate: *requestRate, Burstiness: *burstiness, Seed: *seed, MaxConcurrency: *maxConcurrency,
		IgnoreEOS: *ignoreEOS, NumWarmups: *numWarmups, RequestIDPrefix: prefix, Headers: hdrs,
		Timeout: *requestTimeout, CountEmptyChunks: *countEmpty, Estimator: est, Progress: progress,
		OnMeasureStart: func(ctx context.Context) { before = scrapeAll(ctx) },
	}
	mopts := bench.MetricOptions{PercentileMetrics: pm, Percentiles: ps, Goodput: slo}
	meta := bench.JSONMeta{Label: *label, TokenizerID: "cl100k_base", NumPrompts: len(ds.Requests), Dataset: ds.Name}
	if len(rates) > 0 {
		cfg.OnMeasureStart = nil
		return runSweep(ctx, cfg, rates, mopts, meta, *saveResult, *resultDir, stdout, stderr)
	}
	res, runErr := bench.Run(ctx, cfg)
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
	extra := map[string]any{}
	if len(metricsURLs) > 0 {
		after := scrapeAll(context.WithoutCancel(ctx))
		col, colErr := bench.ColumnFromSnapshots("engine", before, after, bench.VLLMHistogramNames(), match)
		if err := errors.Join(scrapeErr, colErr); err != nil {
			fmt.Fprintln(stderr, "bench: engine metrics:", err)
		}
		if err := bench.WriteComparison(stdout, sum, ps, col); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		extra["gpurouter_engine_urls"] = metricsURLs
		extra["gpurouter_engine_latency_ms"] = engineJSON(col, ps)
	}
	if *saveResult {
		name := *resultFilename
		if name == "" {
			name = bench.DefaultResultFilename(res, *label)
		}
		path := filepath.Join(*resultDir, name)
		meta.Extra = extra
		if err := saveResultFile(path, res, sum, meta); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		fmt.Fprintf(stderr, "bench: saved %s\n", path)
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

// runSweep runs cfg at each rate, printing each point's result block, then
// the SLO matrix as Markdown.
func runSweep(ctx context.Context, cfg bench.Config, rates []float64, mopts bench.MetricOptions, meta bench.JSONMeta, save bool, dir string, stdout, stderr io.Writer) int {
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
	if err := errors.Join(err, saveErr); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	return 0
}

// engineJSON is the engine column for the result file: per row, the mean
// and each percentile with its bucket, in ms (null where unknown).
func engineJSON(col bench.HistogramColumn, ps []float64) map[string]any {
	out := map[string]any{}
	finite := func(v float64) any {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil
		}
		return v * 1000
	}
	for _, row := range bench.ComparisonRows() {
		h, ok := col.Rows[row]
		if !ok {
			continue
		}
		r := map[string]any{"count": h.Count, "mean": finite(h.Mean())}
		for _, p := range ps {
			e := h.Quantile(p / 100)
			r[fmt.Sprintf("p%v", p)] = map[string]any{"value": finite(e.Value), "lower": finite(e.Lower), "upper": finite(e.Upper)}
		}
		out[row] = r
	}
	return out
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
