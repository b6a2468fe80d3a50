package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
	"github.com/gpurouter/gpurouter/kvevents"
)

// simList is a repeatable, comma-splitting string flag.
type simList []string

func (l *simList) String() string { return strings.Join(*l, ",") }
func (l *simList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// runSim is `gpurouter sim`: simulated vLLM replicas on loopback ports, plus
// the `calibrate`, `profiles` and `predict` tools over the same engine model.
func runSim(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "calibrate":
			return runSimCalibrate(stdout, stderr)
		case "profiles":
			return runSimProfiles(stdout)
		case "predict":
			return runSimPredict(args[1:], stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	replicas := fs.Int("replicas", 1, "number of replicas")
	basePort := fs.Int("base-port", 8001, "port of replica 0; replica i listens on base-port+i (0 = ephemeral)")
	host := fs.String("host", "127.0.0.1", "address to listen on")
	var profiles, served simList
	fs.Var(&profiles, "profile", "built-in profile name or YAML file; comma-separated for one per replica (default qwen2.5-7b)")
	speeds := fs.String("speed", "", "per-replica speed factors, e.g. 1,1,1,0.5 (0.5 = half as fast); one value applies to all")
	fs.Var(&served, "served-model-name", "model names the replicas answer to (comma-separated or repeated); the first is reported")
	legacy := fs.Bool("legacy-metrics", false, "expose vllm:gpu_cache_usage_perc (pre-0.10) instead of vllm:kv_cache_usage_perc")
	faults := fs.String("faults", "", `initial faults of every replica, as JSON (the POST /sim/faults document), e.g. '{"error_rate":0.05}'`)
	seed := fs.Uint64("seed", 0, "seed for output lengths and error draws")
	spin := fs.Duration("spin-wait", time.Millisecond, "busy-wait this long before each step's end for timing precision (negative = never)")
	kvEndpoint := fs.String("kv-events-endpoint", "",
		"publish KV-cache events as vLLM's --kv-events-config does: the PUB socket, tcp://HOST:PORT; replica i listens on PORT+i (needs prefix caching; empty = off)")
	kvReplay := fs.String("kv-events-replay-endpoint", "",
		"the replay ROUTER socket, tcp://HOST:PORT; replica i listens on PORT+i (empty = no replay)")
	kvTopic := fs.String("kv-events-topic", "", "topic: the first frame of every KV event message")
	kvEncoding := fs.String("kv-events-encoding", "array", "KV event layout: array (vLLM up to 0.23) or map (0.24 and later)")
	var loraModules simList
	fs.Var(&loraModulesFlag{&loraModules}, "lora-modules",
		`LoRA adapters served from the start, as vLLM's: name=path, or {"name":…,"path":…,"base_model_name":…}; several after one flag, or repeated (needs --enable-lora)`)
	allowLoRAUpdates := fs.Bool("allow-runtime-lora-updating", envTrue(os.Getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING")),
		"serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (default: VLLM_ALLOW_RUNTIME_LORA_UPDATING, as vLLM)")
	engine := sim.RegisterEngineFlags(fs)
	faultFlags := sim.RegisterFaultFlags(fs)
	kvFlags := registerKVTransferFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gpurouter sim --replicas N --base-port P [--profile NAME] [--speed F,F,...] [--served-model-name M] [vLLM engine flags] [fault flags]")
		fmt.Fprintln(stderr, "       gpurouter sim calibrate            print calibration.md targets against the simulator")
		fmt.Fprintln(stderr, "       gpurouter sim profiles             list built-in profiles")
		fmt.Fprintln(stderr, "       gpurouter sim predict [flags]      one replica, virtual time: what a workload would measure")
		fmt.Fprintln(stderr, "\nEach replica serves vLLM's API, /metrics, /health, /v1/gpus and GET|POST /sim/faults.")
		fmt.Fprintln(stderr, "Fault flags (--close-after-response, --close-lag, --timeout-keep-alive, --max-waiting-queue-length, --rate-limited,")
		fmt.Fprintln(stderr, "--retry-after, --crash-every, --crash-down, --kv-events-drop-rate, --kv-events-lose-rate, --kv-events-reorder-rate,")
		fmt.Fprintln(stderr, "--lora-load-refuse, --lora-load-delay, --kv-transfer-stall, --kv-transfer-crash, --kv-transfer-fail-rate)")
		fmt.Fprintln(stderr, "set fields of the initial faults and win over --faults.")
		fmt.Fprintln(stderr, "--kv-transfer-role prefill|decode|both (or vLLM's --kv-transfer-config JSON) makes every replica a NixlConnector")
		fmt.Fprintln(stderr, "replica of a prefill/decode split; run one `gpurouter sim` per role.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(expandLoRAModules(args)); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gpurouter sim: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg := sim.FleetConfig{Replicas: *replicas, Host: *host, BasePort: *basePort, ServedModelNames: served,
		LegacyMetrics: *legacy, Seed: *seed, SpinWait: *spin, AllowRuntimeLoRAUpdating: *allowLoRAUpdates}
	mods, err := sim.ParseLoRAModules(loraModules)
	if err != nil {
		fmt.Fprintln(stderr, "gpurouter sim:", err)
		return 2
	}
	cfg.LoRAModules = mods
	if len(profiles) == 0 {
		profiles = simList{"qwen2.5-7b"}
	}
	for _, name := range profiles {
		p, err := sim.ResolveProfile(name)
		if err == nil {
			err = engine.Apply(&p)
		}
		if err != nil {
			fmt.Fprintln(stderr, "gpurouter sim:", err)
			return 2
		}
		cfg.Profiles = append(cfg.Profiles, p)
	}
	if cfg.Speeds, err = sim.ParseFloatList(*speeds); err != nil {
		fmt.Fprintln(stderr, "gpurouter sim: --speed:", err)
		return 2
	}
	if *faults != "" {
		dec := json.NewDecoder(strings.NewReader(*faults))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg.Faults); err != nil {
			fmt.Fprintln(stderr, "gpurouter sim: --faults:", err)
			return 2
		}
	}
	faultFlags.Apply(&cfg.Faults)
	if cfg.KVTransfer, err = kvFlags.connector(); err != nil {
		fmt.Fprintln(stderr, "gpurouter sim:", err)
		return 2
	}
	if *kvEndpoint != "" {
		enc, err := kvevents.ParseEncoding(*kvEncoding)
		if err != nil {
			fmt.Fprintln(stderr, "gpurouter sim: --kv-events-encoding:", err)
			return 2
		}
		cfg.KVEvents = &sim.KVEventsConfig{Endpoint: *kvEndpoint, ReplayEndpoint: *kvReplay, Topic: *kvTopic, Encoding: enc}
	} else if *kvReplay != "" {
		fmt.Fprintln(stderr, "gpurouter sim: --kv-events-replay-endpoint needs --kv-events-endpoint")
		return 2
	}
	fleet, err := sim.NewFleet(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "gpurouter sim:", err)
		return 2
	}
	if err := fleet.Listen(); err != nil {
		fmt.Fprintln(stderr, "gpurouter sim:", err)
		return 1
	}
	for i, r := range fleet.Replicas() {
		p := r.Profile()
		fmt.Fprintf(stdout, "replica %d ready: %s model=%s profile=%s speed=%s num_gpu_blocks=%d max_num_seqs=%d\n",
			i, fleet.URLs()[i], r.ModelName(), p.Name, speedOf(cfg.Speeds, i), r.NumGPUBlocks(), p.Engine.MaxNumSeqs)
		if p.Engine.EnableLoRA {
			slots, cached, rank := p.LoRASlots()
			fmt.Fprintf(stdout, "replica %d LoRA: max_loras=%d max_cpu_loras=%d max_lora_rank=%d adapters=%d runtime_updating=%v\n",
				i, slots, cached, rank, len(r.Adapters()), cfg.AllowRuntimeLoRAUpdating)
		}
		printKVTransfer(stdout, i, r)
		if pub, replay := r.KVEventsAddr(); pub != "" {
			fmt.Fprintf(stdout, "replica %d KV events: %s replay=%s encoding=%s\n", i, pub, orNone(replay), cfg.KVEvents.Encoding)
		}
	}
	fmt.Fprintln(stdout, "timing error of the simulator itself: gpurouter_sim_step_lag_seconds on each /metrics")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := fleet.Run(ctx); err != nil {
		fmt.Fprintln(stderr, "gpurouter sim:", err)
		return 1
	}
	for i, r := range fleet.Replicas() {
		l := r.StepLag()
		fmt.Fprintf(stdout, "replica %d stopped: %d steps, step lag p50 %v p99 %v max %v\n", i, l.Steps,
			l.P50.Round(time.Microsecond), l.P99.Round(time.Microsecond), l.Max.Round(time.Microsecond))
		if l.P99 > 2*time.Millisecond {
			fmt.Fprintf(stdout, "replica %d: the simulator ran late (p99 > 2ms): latencies measured against it are inflated\n", i)
		}
	}
	return 0
}

// loraModulesFlag is --lora-modules: repeatable, each value one JSON
// object or name=path entries separated by spaces or commas.
type loraModulesFlag struct{ l *simList }

func (f *loraModulesFlag) String() string {
	if f.l == nil {
		return ""
	}
	return strings.Join(*f.l, " ")
}

func (f *loraModulesFlag) Set(v string) error {
	if v = strings.TrimSpace(v); strings.HasPrefix(v, "{") {
		*f.l = append(*f.l, v)
		return nil
	}
	*f.l = append(*f.l, strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' })...)
	return nil
}

// expandLoRAModules joins vLLM's multi-value form "--lora-modules a=/p
// b=/q" into one argument, which the flag package would otherwise stop at.
func expandLoRAModules(args []string) []string {
	isModule := func(v string) bool {
		return !strings.HasPrefix(v, "-") && (strings.Contains(v, "=") || strings.HasPrefix(v, "{"))
	}
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if (a != "--lora-modules" && a != "-lora-modules") || i+1 >= len(args) {
			continue
		}
		i++
		out = append(out, args[i])
		for i+1 < len(args) && isModule(args[i+1]) {
			i++
			out = append(out, a, args[i])
		}
	}
	return out
}

// envTrue reads a boolean environment variable as vLLM does ("1" or
// "true", any case).
func envTrue(v string) bool {
	v = strings.ToLower(strings.TrimSpace(v))
	return v == "1" || v == "true"
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func speedOf(speeds []float64, i int) string {
	if len(speeds) == 0 {
		return "1"
	}
	return fmt.Sprint(speeds[min(i, len(speeds)-1)])
}

func runSimCalibrate(stdout, stderr io.Writer) int {
	rows, err := sim.Calibrate()
	if err != nil {
		fmt.Fprintln(stderr, "gpurouter sim calibrate:", err)
		return 1
	}
	if err := sim.WriteCalibrationTable(stdout, rows); err != nil {
		return 1
	}
	for _, r := range rows {
		if !r.OK() {
			fmt.Fprintf(stderr, "row %s %q is outside ±%.0f%%\n", r.Row, r.Metric, 100*sim.CalibrationTolerance)
			return 1
		}
	}
	return 0
}

func runSimProfiles(stdout io.Writer) int {
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "name\tmodel\tgpu\tnum_gpu_blocks\tdescription")
	for _, name := range sim.ProfileNames() {
		p, _ := sim.Builtin(name)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", p.Name, p.Model.Name, p.Hardware.Name, p.NumGPUBlocks(), p.Description)
	}
	_ = tw.Flush()
	return 0
}

// runSimPredict runs a `vllm bench serve`-shaped random workload against one
// simulated replica in virtual time and prints what it would measure.
func runSimPredict(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sim predict", flag.ContinueOnError)
	fs.SetOutput(stderr)
	profile := fs.String("profile", "qwen2.5-7b", "built-in profile name or YAML file")
	n := fs.Int("num-prompts", 1000, "requests")
	rate := fs.Float64("request-rate", 0, "arrivals per second, Poisson (0 = all at once)")
	conc := fs.Int("max-concurrency", 0, "client-side cap on requests in flight (0 = none)")
	in := fs.Int("random-input-len", 1024, "prompt tokens")
	out := fs.Int("random-output-len", 128, "max_tokens")
	ratio := fs.Float64("random-range-ratio", 0, "lengths uniform in [L(1-r), L(1+r)]")
	ignoreEOS := fs.Bool("ignore-eos", true, "generate exactly max_tokens")
	seed := fs.Uint64("seed", 0, "seed")
	adapters := fs.Int("lora-adapters", 0, "requests name one of this many LoRA adapters (needs --enable-lora)")
	zipf := fs.Float64("lora-zipf", 0, "adapter popularity: Zipf exponent over their rank (0 = uniform)")
	replicas := fs.Int("replicas", 1, "colocated replicas, behind a router sending each request where the fewest are outstanding")
	prefillN := fs.Int("prefill-replicas", 0, "a prefill/decode split instead: this many prefill replicas (with --decode-replicas)")
	decodeN := fs.Int("decode-replicas", 0, "a prefill/decode split: this many decode replicas")
	bandwidth := fs.Float64("kv-transfer-bandwidth", sim.DefaultKVTransferBandwidthGBps, "a split's KV transfer bandwidth, GB/s")
	goodput := fs.String("goodput", "", `SLOs judging goodput, in ms, as vllm bench's --goodput: "ttft:2000 tpot:50"`)
	engine := sim.RegisterEngineFlags(fs)
	if err := fs.Parse(expandGoodput(args)); err != nil {
		return 2
	}
	slos, err := parsePredictSLOs(*goodput)
	if err != nil {
		fmt.Fprintln(stderr, "gpurouter sim predict: --goodput:", err)
		return 2
	}
	shape := sim.FleetShape{Replicas: *replicas, Prefill: *prefillN, Decode: *decodeN, BandwidthGBps: *bandwidth}
	p, err := sim.ResolveProfile(*profile)
	if err == nil {
		err = engine.Apply(&p)
	}
	if err != nil {
		fmt.Fprintln(stderr, "gpurouter sim predict:", err)
		return 2
	}
	rep, err := sim.SimulateFleet(p, sim.Workload{NumPrompts: *n, RequestRate: *rate, MaxConcurrency: *conc, IgnoreEOS: *ignoreEOS,
		Seed: *seed, Classes: []sim.RequestClass{{InputLen: *in, OutputLen: *out, RangeRatio: *ratio}},
		Adapters: *adapters, AdapterZipf: *zipf, SLOTTFT: slos[0], SLOTPOT: slos[1]}, shape)
	if err != nil {
		fmt.Fprintln(stderr, "gpurouter sim predict:", err)
		return 2
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }
	w := stdout
	fmt.Fprintf(w, "%s\n", center(" Simulated Benchmark Result ("+p.Name+") ", 50, '='))
	fmt.Fprintf(w, "%-40s %v\n", "Fleet:", fleetText(shape))
	row := func(k string, v any) { fmt.Fprintf(w, "%-40s %v\n", k, v) }
	row("Successful requests:", rep.Completed)
	row("Benchmark duration (s):", fmt.Sprintf("%.2f", rep.Duration.Seconds()))
	row("Total input tokens:", rep.InputTokens)
	row("Total generated tokens:", rep.OutputTokens)
	row("Request throughput (req/s):", fmt.Sprintf("%.2f", rep.RequestThroughput))
	if *goodput != "" {
		row("Request goodput (req/s):", fmt.Sprintf("%.2f", rep.RequestGoodput))
	}
	row("Output token throughput (tok/s):", fmt.Sprintf("%.2f", rep.OutputThroughput))
	row("Total token throughput (tok/s):", fmt.Sprintf("%.2f", rep.TotalTokenThroughput))
	row("Peak concurrent requests:", rep.PeakConcurrency)
	for _, s := range []struct {
		title, short string
		d            sim.Dist
	}{{"Time to First Token", "TTFT", rep.TTFT}, {"Time per Output Token (excl. 1st token)", "TPOT", rep.TPOT},
		{"Inter-token Latency", "ITL", rep.ITL}, {"End-to-end Latency", "E2EL", rep.E2E}} {
		fmt.Fprintln(w, center(s.title, 50, '-'))
		row("Mean "+s.short+" (ms):", ms(s.d.Mean))
		row("Median "+s.short+" (ms):", ms(s.d.Median))
		row("P99 "+s.short+" (ms):", ms(s.d.P99))
	}
	fmt.Fprintln(w, center("Engine", 50, '-'))
	row("Mean batch (seqs/step):", fmt.Sprintf("%.1f", rep.MeanBatch))
	row("Mean / peak KV cache usage:", fmt.Sprintf("%.2f / %.2f", rep.MeanKVUsage, rep.PeakKVUsage))
	row("Preemptions:", rep.Preemptions)
	row("Prefix cache hit rate:", fmt.Sprintf("%.3f", rep.PrefixCacheHitRate))
	if shape.Split() {
		row("KV reads:", rep.KVTransfers)
		row("Mean / P99 KV read (ms):", ms(rep.KVTransferTime.Mean)+" / "+ms(rep.KVTransferTime.P99))
	}
	if *adapters > 0 {
		row("LoRA swaps from CPU / disk:", fmt.Sprintf("%d / %d", rep.LoRASwapsCPU, rep.LoRASwapsDisk))
		row("LoRA swap time (s):", fmt.Sprintf("%.2f", rep.LoRASwapTime.Seconds()))
	}
	fmt.Fprintln(w, strings.Repeat("=", 50))
	return 0
}

func center(s string, n int, c rune) string {
	if len(s) >= n {
		return s
	}
	left := (n - len([]rune(s))) / 2
	right := n - len([]rune(s)) - left
	return strings.Repeat(string(c), left) + s + strings.Repeat(string(c), right)
}
