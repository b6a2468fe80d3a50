package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/bench"
	"github.com/gpurouter/gpurouter/bench/tokens"
)

// benchFlags are the flags every `gpurouter bench` form shares: vllm bench
// serve's names for the workload and the metrics, plus --report.
type benchFlags struct {
	fs *flag.FlagSet

	host, endpoint, backend, model            *string
	baseURLs                                  benchList
	port, numPrompts, maxConcurrency          *int
	requestRate, burstiness                   *float64
	datasetName, datasetPath                  *string
	randomInputLen, randomOutputLen           *int
	randomRangeRatio, timeScale               *float64
	randomOutputRangeRatio                    *float64
	maxModelLen                               *int
	sharegptOutputLen, customOutputLen        *int
	ignoreEOS, saveResult, countEmpty         *bool
	disableTqdm                               *bool
	goodput, headers                          benchList
	percentileMetrics, metricPercentiles      *string
	seed                                      *uint64
	numWarmups                                *int
	resultDir, resultFilename, label, profile *string
	requestTimeout                            *time.Duration
	requestIDPrefix, tokenizer, report        *string
	lora                                      *loraFlags

	// set holds the names of the flags given on the command line.
	set map[string]bool
}

func newBenchFlags(name string, stderr io.Writer, usage string) *benchFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage)
		fs.PrintDefaults()
	}
	f := &benchFlags{fs: fs}
	fs.Var(&f.baseURLs, "base-url", "server (router or engine) URL; default http://HOST:PORT. Repeatable: several routers of one service, request i goes to the (i mod n)-th, round-robin as a Kubernetes Service spreads them (the router column then needs one router: it is left out)")
	f.host = fs.String("host", "127.0.0.1", "server host when --base-url is not given")
	f.port = fs.Int("port", 8000, "server port when --base-url is not given")
	f.endpoint = fs.String("endpoint", "", "API path: /v1/completions (default) or /v1/chat/completions")
	f.backend = fs.String("backend", "openai", "openai (completions) or openai-chat (chat completions); sets the default --endpoint")
	f.model = fs.String("model", "", "model name; default: the first id of GET /v1/models")
	f.numPrompts = fs.Int("num-prompts", 1000, "number of requests (azure-trace, mooncake: the first N rows; default the whole trace)")
	f.requestRate = fs.Float64("request-rate", math.Inf(1), "mean request rate in req/s; inf sends all at once")
	f.burstiness = fs.Float64("burstiness", 1, "gamma shape of inter-arrival gaps: 1 Poisson, <1 burstier, >1 more regular")
	f.maxConcurrency = fs.Int("max-concurrency", 0, "cap on requests in flight (0: none)")
	f.datasetName = fs.String("dataset-name", bench.DatasetRandom, "dataset: "+strings.Join(bench.DatasetNames(), ", "))
	f.datasetPath = fs.String("dataset-path", "", "dataset file (sharegpt JSON, azure-trace CSV, custom JSONL, mooncake JSONL)")
	f.randomInputLen = fs.Int("random-input-len", 1024, "random dataset: input tokens")
	f.randomOutputLen = fs.Int("random-output-len", 128, "random dataset: output tokens")
	f.randomRangeRatio = fs.Float64("random-range-ratio", 0, "random/usecase: lengths uniform in [L(1-r), L(1+r)], 0 <= r < 1")
	f.randomOutputRangeRatio = fs.Float64("random-output-range-ratio", 0, "random: the output lengths' range ratio, when > 0 (default: --random-range-ratio)")
	f.maxModelLen = fs.Int("max-model-len", 0, "drop requests whose prompt + output exceed this many tokens, as vLLM refuses them (0: keep all)")
	f.sharegptOutputLen = fs.Int("sharegpt-output-len", 0, "sharegpt: fixed output length instead of the reference completion's")
	f.customOutputLen = fs.Int("custom-output-len", 256, "custom: output tokens of records without output_tokens")
	f.timeScale = fs.Float64("time-scale", 1, "azure-trace, mooncake: replay speed-up; arrival offsets are divided by it (2 = twice as fast)")
	f.ignoreEOS = fs.Bool("ignore-eos", false, "send ignore_eos so the engine generates exactly max_tokens (default on for azure-trace, mooncake and the profiles)")
	fs.Var(&f.goodput, "goodput", "SLOs in ms for goodput, KEY:VALUE with keys ttft, tpot, e2el (\"ttft:500 tpot:50\"; repeatable)")
	f.percentileMetrics = fs.String("percentile-metrics", "ttft,tpot,itl", "metrics to print percentiles of: ttft,tpot,itl,e2el")
	f.metricPercentiles = fs.String("metric-percentiles", "99", "percentiles to report, e.g. 50,90,99")
	f.seed = fs.Uint64("seed", 0, "seed of datasets and arrivals")
	f.numWarmups = fs.Int("num-warmups", 0, "warm-up requests before the run, excluded from results")
	f.saveResult = fs.Bool("save-result", false, "write the result JSON")
	f.resultDir = fs.String("result-dir", "", "directory of the result JSON (default .)")
	f.resultFilename = fs.String("result-filename", "", "result JSON name (default like vllm: LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json)")
	f.label = fs.String("label", "", "label of the run in the result (default the backend)")
	f.profile = fs.String("profile", "", "preset: sharegpt, throughput, long-context, generation-heavy, mixed (calibration.md)")
	fs.Var(&f.headers, "header", "KEY=VALUE header added to every request (repeatable); OPENAI_API_KEY sets Authorization")
	f.requestTimeout = fs.Duration("request-timeout", 0, "per-request limit from send to end of stream (0: none)")
	f.requestIDPrefix = fs.String("request-id-prefix", "", "X-Request-Id prefix (default bench-<8 hex>-)")
	f.countEmpty = fs.Bool("count-empty-chunks", false, "count every chunk with choices as an output chunk, as vllm bench does (default: only chunks carrying text)")
	f.disableTqdm = fs.Bool("disable-tqdm", false, "no progress bar")
	f.tokenizer = fs.String("tokenizer", "", "accepted for vllm compatibility; gpurouter counts tokens with cl100k_base")
	f.report = fs.String("report", "", "write a Markdown report with PNG plots into this directory")
	f.lora = registerLoRAFlags(fs)
	return f
}

// parse parses args (vllm's multi-value --goodput allowed) and records
// which flags were given. It reports whether to go on.
func (f *benchFlags) parse(args []string) bool {
	if err := f.fs.Parse(expandLoRANames(expandGoodput(args))); err != nil {
		return false
	}
	f.set = map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	return true
}

// benchSetup is what the shared flags resolve to before any network I/O.
type benchSetup struct {
	cfg   bench.Config
	mopts bench.MetricOptions
	meta  bench.JSONMeta
	dcfg  bench.DatasetConfig
	ps    []float64
	// headers are the --header values (and OPENAI_API_KEY).
	headers map[string]string
	// datasetExtra are result-file keys about the dataset (set by load).
	datasetExtra map[string]any
	// adapters spread the requests over LoRA adapters (--lora-*); the
	// zero mix sends every request to --model.
	adapters bench.AdapterMix
}

// resolve applies --profile and the dataset defaults, then validates every
// shared flag, returning every problem. A nil setup with no problems means
// the token estimator could not be built (already printed).
func (f *benchFlags) resolve(stderr io.Writer) (*benchSetup, []string) {
	if *f.tokenizer != "" {
		fmt.Fprintln(stderr, "bench: --tokenizer ignored: prompt tokens are counted with cl100k_base")
	}
	var errs []string
	if f.fs.NArg() > 0 {
		errs = append(errs, fmt.Sprintf("unexpected arguments: %v", f.fs.Args()))
	}
	if *f.profile != "" {
		p, ok := benchProfiles()[*f.profile]
		if !ok {
			return nil, []string{fmt.Sprintf("--profile %q: want one of sharegpt, throughput, long-context, generation-heavy, mixed", *f.profile)}
		}
		f.applyProfile(p)
	}
	trace := *f.datasetName == bench.DatasetAzureTrace || *f.datasetName == bench.DatasetMooncake
	if trace && !f.set["ignore-eos"] {
		*f.ignoreEOS = true // a replay must generate the trace's lengths (data/README.md)
	}
	if trace && !f.set["num-prompts"] {
		*f.numPrompts = 0 // the whole trace
	}
	if len(f.baseURLs) == 0 {
		f.baseURLs = benchList{fmt.Sprintf("http://%s:%d", *f.host, *f.port)}
	}
	if *f.endpoint == "" {
		switch *f.backend {
		case "openai", "vllm":
			*f.endpoint = bench.EndpointCompletions
		case "openai-chat":
			*f.endpoint = bench.EndpointChat
		default:
			errs = append(errs, fmt.Sprintf("--backend %q: want openai or openai-chat", *f.backend))
		}
	}
	if *f.numPrompts < 0 || (*f.numPrompts == 0 && !trace) {
		errs = append(errs, fmt.Sprintf("--num-prompts %d: want at least 1", *f.numPrompts))
	}
	if !(*f.requestRate > 0) {
		errs = append(errs, fmt.Sprintf("--request-rate %v: want a positive number or inf", *f.requestRate))
	}
	if !(*f.burstiness > 0) {
		errs = append(errs, fmt.Sprintf("--burstiness %v: want a positive number", *f.burstiness))
	}
	if *f.maxConcurrency < 0 || *f.numWarmups < 0 || *f.requestTimeout < 0 {
		errs = append(errs, "--max-concurrency, --num-warmups and --request-timeout must not be negative")
	}
	if !(*f.timeScale > 0) || math.IsInf(*f.timeScale, 0) {
		errs = append(errs, fmt.Sprintf("--time-scale %v: want a positive number", *f.timeScale))
	}
	slo, err := bench.ParseGoodput(f.goodput)
	if err != nil {
		errs = append(errs, "--goodput: "+optionText(err))
	}
	pm, err := bench.ParsePercentileMetrics(*f.percentileMetrics)
	if err != nil {
		errs = append(errs, "--percentile-metrics: "+optionText(err))
	}
	ps, err := bench.ParseMetricPercentiles(*f.metricPercentiles)
	if err != nil {
		errs = append(errs, "--metric-percentiles: "+optionText(err))
	}
	hdrs := map[string]string{}
	if key := os.Getenv("OPENAI_API_KEY"); key != "" {
		hdrs["Authorization"] = "Bearer " + key
	}
	for _, h := range f.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			errs = append(errs, fmt.Sprintf("--header %q: want KEY=VALUE", h))
			continue
		}
		hdrs[k] = v
	}
	est, err := tokens.New()
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return nil, nil
	}
	dcfg := bench.DatasetConfig{
		Name: *f.datasetName, Path: *f.datasetPath, NumPrompts: *f.numPrompts, Seed: *f.seed,
		RandomInputLen: *f.randomInputLen, RandomOutputLen: *f.randomOutputLen, RandomRangeRatio: *f.randomRangeRatio,
		RandomOutputRangeRatio: *f.randomOutputRangeRatio, ShareGPTOutputLen: *f.sharegptOutputLen, CustomOutputLen: *f.customOutputLen,
		TimeScale: *f.timeScale, MaxModelLen: *f.maxModelLen, Estimator: est,
	}
	mix, lerrs := f.lora.mix(f.set)
	errs = append(errs, lerrs...)
	if err := dcfg.Validate(); err != nil {
		for _, e := range strings.Split(err.Error(), "\n") {
			errs = append(errs, strings.TrimPrefix(e, "bench: "))
		}
	}
	s := &benchSetup{
		cfg: bench.Config{
			BaseURL: f.baseURLs[0], MoreBaseURLs: f.baseURLs[1:], Endpoint: *f.endpoint, Model: *f.model,
			RequestRate: *f.requestRate, Burstiness: *f.burstiness, Seed: *f.seed, MaxConcurrency: *f.maxConcurrency,
			IgnoreEOS: *f.ignoreEOS, NumWarmups: *f.numWarmups, RequestIDPrefix: *f.requestIDPrefix, Headers: hdrs,
			Timeout: *f.requestTimeout, CountEmptyChunks: *f.countEmpty, Estimator: est,
		},
		mopts:    bench.MetricOptions{PercentileMetrics: pm, Percentiles: ps, Goodput: slo},
		meta:     bench.JSONMeta{Label: *f.label, TokenizerID: "cl100k_base", Dataset: *f.datasetName},
		dcfg:     dcfg,
		ps:       ps,
		headers:  hdrs,
		adapters: mix,
	}
	return s, errs
}

func (f *benchFlags) applyProfile(p benchProfile) {
	if !f.set["dataset-name"] {
		*f.datasetName = p.dataset
		if p.dataset == bench.DatasetShareGPT && *f.datasetPath == "" {
			*f.datasetName = bench.DatasetShareGPTSynthetic
		}
	}
	if !f.set["random-input-len"] && p.in > 0 {
		*f.randomInputLen = p.in
	}
	if !f.set["random-output-len"] && p.out > 0 {
		*f.randomOutputLen = p.out
	}
	if !f.set["request-rate"] {
		*f.requestRate = p.rate
	}
	if !f.set["num-prompts"] {
		*f.numPrompts = p.numPrompts
	}
	if !f.set["max-concurrency"] {
		*f.maxConcurrency = p.maxConcurrency
	}
	if !f.set["ignore-eos"] {
		*f.ignoreEOS = p.ignoreEOS
	}
	if !f.set["percentile-metrics"] && p.percentileMetric != "" {
		*f.percentileMetrics = p.percentileMetric
	}
}

// load builds the dataset, asks modelURL for the model when --model was not
// given, draws the request-ID prefix and attaches a progress bar when
// stderr is a terminal. It returns 0 or an exit code.
func (f *benchFlags) load(ctx context.Context, s *benchSetup, modelURL string, stderr io.Writer) int {
	ds, err := bench.LoadDataset(s.dcfg)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	s.cfg.Requests, s.cfg.Timed = ds.Requests, ds.Timed
	s.meta.NumPrompts, s.meta.Dataset = len(ds.Requests), ds.Name
	if ds.Dropped > 0 {
		fmt.Fprintf(stderr, "bench: dropped %d of %d requests longer than --max-model-len %d (prompt + output), as vLLM would refuse them\n",
			ds.Dropped, ds.Dropped+len(ds.Requests), *f.maxModelLen)
	}
	if len(ds.Requests) == 0 {
		fmt.Fprintln(stderr, "bench: no requests left to send")
		return 1
	}
	s.datasetExtra = map[string]any{"gpurouter_dataset_dropped": ds.Dropped}
	if r, ok := ds.IdealPrefixHitRate(); ok {
		// What one shared cache of unbounded size would hit: the ceiling
		// of every replica's prefix-cache hit rate together.
		fmt.Fprintf(stderr, "bench: ideal prefix-cache hit rate of these %d requests (one shared unbounded cache): %.3f\n", len(ds.Requests), r)
		s.datasetExtra["gpurouter_ideal_prefix_cache_hit_rate"] = r
	}
	if len(s.adapters.Names) > 0 {
		// Mixed into whatever dataset it is, with a stream of its own.
		s.adapters.Assign(s.cfg.Requests, s.dcfg.Seed)
		for k, v := range describeMix(stderr, s.adapters) {
			s.datasetExtra[k] = v
		}
	}
	if s.cfg.Model == "" {
		if s.cfg.Model, err = bench.FirstModel(ctx, modelURL, s.headers); err != nil {
			fmt.Fprintf(stderr, "bench: no --model and %v\n", err)
			return 1
		}
	}
	if s.cfg.RequestIDPrefix == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		s.cfg.RequestIDPrefix = "bench-" + hex.EncodeToString(b[:]) + "-"
	}
	if !*f.disableTqdm {
		s.cfg.Progress = terminal(stderr)
	}
	return 0
}

// optionText strips the package prefix from an option error.
func optionText(err error) string {
	return strings.TrimPrefix(err.Error(), "bench: option: ")
}

// parseRates parses a comma-separated list of positive request rates (inf
// allowed).
func parseRates(flagName, list string) ([]float64, []string) {
	var rates []float64
	var errs []string
	for _, f := range strings.Split(list, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(r > 0) {
			errs = append(errs, fmt.Sprintf("--%s: %q is not a positive rate or inf", flagName, f))
			continue
		}
		rates = append(rates, r)
	}
	return rates, errs
}

// benchTarget is one --targets entry.
type benchTarget struct{ label, url string }

// parseTargets parses --targets values: LABEL=URL entries, comma-separated
// and/or repeated; labels must be unique.
func parseTargets(values []string) ([]benchTarget, []string) {
	var out []benchTarget
	var errs []string
	seen := map[string]bool{}
	for _, v := range values {
		for _, e := range strings.Split(v, ",") {
			e = strings.TrimSpace(e)
			if e == "" {
				continue
			}
			label, u, ok := strings.Cut(e, "=")
			pu, err := url.Parse(u)
			if !ok || label == "" || err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
				errs = append(errs, fmt.Sprintf("--targets %q: want LABEL=http(s)://HOST:PORT", e))
				continue
			}
			if seen[label] {
				errs = append(errs, fmt.Sprintf("--targets: label %q given twice", label))
				continue
			}
			seen[label] = true
			out = append(out, benchTarget{label: label, url: u})
		}
	}
	return out, errs
}

// printErrors prints every problem and returns the usage exit code.
func printErrors(stderr io.Writer, errs []string) int {
	for _, e := range errs {
		fmt.Fprintln(stderr, "bench:", e)
	}
	return 2
}
