package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpurouter/gpurouter/bench"
	"github.com/gpurouter/gpurouter/bench/sim"
	"github.com/gpurouter/gpurouter/bench/tokens"
	"golang.org/x/term"
)

// demoPercentiles are the percentiles the demo reports.
func demoPercentiles() []float64 { return []float64{50, 90, 99} }

// demoOptions are `gpurouter demo`'s flags.
type demoOptions struct {
	duration time.Duration
	out      string
	rate     float64
	seed     uint64
	replicas int
	profile  string
	// quiet turns the progress bar off (vllm bench's --disable-tqdm).
	quiet bool
}

// runDemo is `gpurouter demo`: simulated replicas (the last at half speed)
// and the router, on loopback ephemeral ports in this process; the usecase
// mix through the router for --duration; then the vllm result block, the
// client/router/engine table, the decomposition of the mean request, and
// the report with plots in --out. Everything it starts is stopped before
// it returns.
func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o demoOptions
	fs.DurationVar(&o.duration, "duration", 40*time.Second, "how long requests keep arriving (the run ends when the last one finishes)")
	fs.StringVar(&o.out, "out", "gpurouter-demo", "directory for report.md, the plots and the result JSON")
	fs.Float64Var(&o.rate, "rate", 12, "mean request rate (req/s, Poisson arrivals)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the workload, the arrivals and the replicas")
	fs.IntVar(&o.replicas, "replicas", 4, "simulated replicas; the last runs at half speed (when there are at least two)")
	fs.StringVar(&o.profile, "profile", "qwen2.5-7b", "simulator profile of every replica (gpurouter sim profiles)")
	fs.BoolVar(&o.quiet, "disable-tqdm", false, "no progress bar (there is none anyway when stderr is not a terminal)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gpurouter demo [flags]   (needs no flags, files, network or GPU)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected arguments: %v\n", fs.Args())
		return 2
	}
	var errs []string
	if o.duration <= 0 {
		errs = append(errs, fmt.Sprintf("--duration %v: want a positive duration", o.duration))
	}
	if !(o.rate > 0) || math.IsInf(o.rate, 0) {
		errs = append(errs, fmt.Sprintf("--rate %v: want a positive number", o.rate))
	}
	if o.replicas < 1 || o.replicas > 64 {
		errs = append(errs, fmt.Sprintf("--replicas %d: want 1 to 64", o.replicas))
	}
	if o.out == "" {
		errs = append(errs, "--out: want a directory")
	}
	prof, err := sim.Builtin(o.profile)
	if err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		for _, e := range errs {
			fmt.Fprintln(stderr, "demo:", e)
		}
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo(ctx, o, prof, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	return 0
}

// demoSpeeds is every replica at full speed but the last at half, so the
// policy has a slow replica to steer around.
func demoSpeeds(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = 1
	}
	if n > 1 {
		s[n-1] = 0.5
	}
	return s
}

// demo runs the fleet, the router and the benchmark, and writes the report.
// It stops the router (draining into the fleet), then the fleet, and waits
// for both before it returns, on every path.
func demo(ctx context.Context, o demoOptions, prof sim.Profile, stdout, stderr io.Writer) (err error) {
	est, err := tokens.New()
	if err != nil {
		return err
	}
	speeds := demoSpeeds(o.replicas)
	fleet, err := sim.NewFleet(sim.FleetConfig{Replicas: o.replicas, Profiles: []sim.Profile{prof}, Speeds: speeds, Seed: o.seed, Estimator: est})
	if err != nil {
		return err
	}
	if err := fleet.Listen(); err != nil {
		return err
	}
	fleetCtx, stopFleet := context.WithCancel(context.Background())
	fleetDone := make(chan error, 1)
	go func() { fleetDone <- fleet.Run(fleetCtx) }()
	defer func() {
		stopFleet()
		err = errors.Join(err, <-fleetDone)
	}()
	model := fleet.Replicas()[0].ModelName()

	cfg, err := configFromFlags("127.0.0.1:0", []string{model + "=" + strings.Join(fleet.URLs(), ",")}, "least_request")
	if err != nil {
		return err
	}
	for i := range cfg.Pools[0].Replicas {
		cfg.Pools[0].Replicas[i].Name = fmt.Sprintf("sim-%d", i)
		if speeds[i] != 1 {
			cfg.Pools[0].Replicas[i].Name += fmt.Sprintf("-speed-%g", speeds[i])
		}
	}
	cfg.Log = logConfig{Level: "warn", Format: "console"}
	log, err := newLogger(cfg.Log, stderr)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck
	r, err := newRouter(cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	routerCtx, stopRouter := context.WithCancel(context.Background())
	routerDone := make(chan error, 1)
	go func() { routerDone <- r.run(routerCtx, ln, 5*time.Second) }()
	defer func() { // runs before the fleet's: the router drains into a live fleet
		stopRouter()
		err = errors.Join(err, <-routerDone)
	}()

	return demoRun(ctx, o, prof, model, "http://"+ln.Addr().String(), est, stdout, stderr)
}

// demoRun benchmarks the router and prints and writes the report.
func demoRun(ctx context.Context, o demoOptions, prof sim.Profile, model, routerURL string, est *tokens.Estimator, stdout, stderr io.Writer) error {
	n := max(1, int(math.Round(o.rate*o.duration.Seconds())))
	ds := bench.UseCaseDataset(bench.DatasetConfig{Name: bench.DatasetUseCase, NumPrompts: n, Seed: o.seed, RandomRangeRatio: 0.2, Estimator: est},
		rand.New(rand.NewPCG(o.seed, 0x5eed)))
	fmt.Fprintf(stdout, "gpurouter demo: %d simulated %s replicas (%s)%s\n", o.replicas, prof.Name, prof.Description, halfNote(o.replicas))
	fmt.Fprintf(stdout, "behind gpurouter (least_request) at %s; usecase mix, %d requests at %g req/s (Poisson) for ~%s\n\n",
		routerURL, n, o.rate, o.duration)

	ps := demoPercentiles()
	cfg := bench.Config{
		BaseURL: routerURL, Model: model, Requests: ds.Requests, RequestRate: o.rate, Seed: o.seed,
		IgnoreEOS: true, RequestIDPrefix: "demo-", Estimator: est,
	}
	if !o.quiet {
		cfg.Progress = terminal(stderr)
	}
	obs := newObserver(cfg, nil, nil)
	cfg.OnMeasureStart = func(ctx context.Context) { _ = obs.Before(ctx) }
	res, err := bench.Run(ctx, cfg)
	if res == nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("interrupted after %d requests: %w", len(res.Records), err)
	}
	sum := bench.Summarize(res, bench.MetricOptions{
		PercentileMetrics: []string{bench.MetricTTFT, bench.MetricTPOT, bench.MetricITL, bench.MetricE2EL}, Percentiles: ps})
	if err := bench.WriteConsole(stdout, res, sum); err != nil {
		return err
	}
	var server bytes.Buffer
	side, err := observeAfter(ctx, obs, res, sum, ps, io.MultiWriter(stdout, &server), stderr)
	if err != nil {
		return err
	}
	if err := writeDemoReport(o, prof, res, sum, side, server.String()); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nReport: %s (plots and %s beside it)\n", filepath.Join(o.out, bench.ReportFile), demoResultFile)
	if sum.Completed == 0 {
		return errors.New("every request failed")
	}
	return nil
}

func halfNote(n int) string {
	if n < 2 {
		return ""
	}
	return fmt.Sprintf("; sim-%d runs at half speed", n-1)
}

// terminal is w when it is a terminal, else nil: where a progress bar
// goes. Redirected to a file, a pipe or /dev/null (a character device,
// which a mode check would take for a terminal), output gets no bar.
func terminal(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return w
	}
	return nil
}

// demoResultFile is the vllm-style result JSON the demo writes beside the
// report.
const demoResultFile = "result.json"

// writeDemoReport writes o.out/report.md with its plots (bench.WriteReport)
// and o.out/result.json (vllm bench's keys plus the router, engine and
// decomposition sections).
func writeDemoReport(o demoOptions, prof sim.Profile, res *bench.Result, sum *bench.Summary, side serverSide, serverText string) error {
	notes := []string{
		fmt.Sprintf("`gpurouter demo --duration %s --rate %g --replicas %d --seed %d`: %d simulated %s replicas%s behind gpurouter (least_request), the usecase mix at %g req/s.",
			o.duration, o.rate, o.replicas, o.seed, o.replicas, prof.Name, halfNote(o.replicas), o.rate),
		"Client, router and engine side by side (the router's records matched to the client's requests by X-Request-Id), and where the mean request's time goes:",
		"```text\n" + strings.TrimRight(serverText, "\n") + "\n```",
	}
	ps := demoPercentiles()
	reportErr := bench.WriteReport(o.out, bench.ReportInput{
		Title: "gpurouter demo", Notes: notes, Result: res, Summary: sum, Percentiles: ps,
		Router: side.router, Engine: side.engine, RouterMatch: side.match, Breakdown: side.breakdown,
	})
	meta := bench.JSONMeta{Label: "gpurouter-demo", TokenizerID: "cl100k_base", NumPrompts: len(res.Records),
		Dataset: bench.DatasetUseCase, Extra: side.extra}
	return errors.Join(reportErr, saveResultFile(filepath.Join(o.out, demoResultFile), res, sum, meta))
}
