package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpurouter/gpurouter/bench"
)

// parseSLO parses one --slo value: an optional NAME= and then vllm's
// goodput pairs in ms, comma- or space-separated ("chat=ttft:500,tpot:50").
func parseSLO(v string) (bench.NamedSLO, error) {
	var n bench.NamedSLO
	if name, rest, ok := strings.Cut(v, "="); ok && !strings.Contains(name, ":") {
		n.Name, v = name, rest
	}
	slo, err := bench.ParseGoodput([]string{strings.ReplaceAll(v, ",", " ")})
	if err != nil {
		return n, err
	}
	if !slo.IsSet() {
		return n, fmt.Errorf("%w: empty SLO", bench.ErrOption)
	}
	n.SLO = slo
	return n, nil
}

// targetLabel names a target without --targets: --label, else host:port.
func targetLabel(label, baseURL string) string {
	if label != "" {
		return label
	}
	if u, err := url.Parse(baseURL); err == nil && u.Host != "" {
		return u.Host
	}
	return baseURL
}

// runBenchSweep is `gpurouter bench sweep`: every target at every rate, one
// row each, then per SLO the compliance matrix and the capacity table with
// the winner, as Markdown.
func runBenchSweep(args []string, stdout, stderr io.Writer) int {
	f := newBenchFlags("bench sweep", stderr,
		"usage: gpurouter bench sweep --request-rates R,R,... [--targets LABEL=URL,...] [--slo [NAME=]ttft:MS,tpot:MS ...] [bench flags]\n"+
			"Runs the workload at each rate against each target (one after the other, same requests and seed) and prints\n"+
			"a row per target and rate, the SLO compliance matrix, and the max SLO-compliant rate per target with the winner.")
	ratesFlag := f.fs.String("request-rates", "", "comma-separated request rates in req/s (inf allowed); required")
	var targetsFlag, sloFlags benchList
	f.fs.Var(&targetsFlag, "targets", "LABEL=URL targets, comma-separated or repeated (default: --base-url, labelled --label or host:port)")
	f.fs.Var(&sloFlags, "slo", "an SLO column, [NAME=]KEY:MS[,KEY:MS] with keys ttft, tpot, e2el (repeatable; default: --goodput)")
	sloPercentile := f.fs.Float64("slo-percentile", 99, "percentile the SLOs are judged at")
	cooldown := f.fs.Duration("cooldown", 0, "pause between runs so queues drain")
	if !f.parse(args) {
		return 2
	}
	s, errs := f.resolve(stderr)
	if s == nil && len(errs) == 0 {
		return 1
	}
	if f.set["request-rate"] {
		errs = append(errs, "give --request-rates, not --request-rate, to bench sweep")
	}
	var rates []float64
	if *ratesFlag == "" {
		errs = append(errs, "--request-rates is required, e.g. 0.5,1,2,4")
	} else {
		r, rerrs := parseRates("request-rates", *ratesFlag)
		rates, errs = r, append(errs, rerrs...)
	}
	targets, terrs := parseTargets(targetsFlag)
	errs = append(errs, terrs...)
	if len(targets) > 0 && len(f.baseURLs) > 1 {
		errs = append(errs, "give --targets or several --base-url, not both")
	}
	var slos []bench.NamedSLO
	for _, v := range sloFlags {
		n, err := parseSLO(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("--slo %q: %s", v, optionText(err)))
			continue
		}
		slos = append(slos, n)
	}
	if !(*sloPercentile > 0 && *sloPercentile <= 100) {
		errs = append(errs, fmt.Sprintf("--slo-percentile %v: want (0, 100]", *sloPercentile))
	}
	if *cooldown < 0 {
		errs = append(errs, "--cooldown must not be negative")
	}
	if len(errs) > 0 {
		return printErrors(stderr, errs)
	}
	if len(slos) == 0 && s.mopts.Goodput.IsSet() {
		slos = append(slos, bench.NamedSLO{SLO: s.mopts.Goodput})
	}
	if len(targets) == 0 {
		targets = []benchTarget{{label: targetLabel(*f.label, s.cfg.BaseURL), url: s.cfg.BaseURL}}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if code := f.load(ctx, s, targets[0].url, stderr); code != 0 {
		return code
	}
	sweepTargets := make([]bench.SweepTarget, len(targets))
	names := make([]string, len(targets))
	for i, t := range targets {
		sweepTargets[i] = bench.SweepTarget{Label: t.label, BaseURL: t.url}
		names[i] = t.label + "=" + t.url
	}
	fmt.Fprintf(stdout, "Sweep: targets %s; request rates %s; %d requests per run (%s, seed %d)\n",
		strings.Join(names, ", "), *ratesFlag, len(s.cfg.Requests), s.meta.Dataset, s.cfg.Seed)
	p := *sloPercentile
	pl := "P" + strconv.FormatFloat(p, 'f', -1, 64)
	var saveErr error
	sweeps, err := bench.SweepTargets(ctx, bench.SweepConfig{
		Base: s.cfg, Rates: rates, Metrics: s.mopts, SLOs: slos, SLOPercentile: p, Cooldown: *cooldown,
		OnPoint: func(pt bench.SweepPoint) {
			sum := pt.Summary
			fmt.Fprintf(stdout, "%s @ %s req/s: %d ok, %d failed, %.1f output tok/s, %s TTFT %.1f ms, %s TPOT %.1f ms, max concurrent %d\n",
				pt.Target, rateString(pt.Rate), sum.Completed, sum.Failed, sum.OutputThroughput,
				pl, sum.TTFT.At(p), pl, sum.TPOT.At(p), sum.MaxConcurrentRequests)
			if *f.saveResult {
				meta := s.meta
				meta.Label = pt.Target
				path := filepath.Join(*f.resultDir, bench.DefaultResultFilename(pt.Result, meta.Label))
				if err := saveResultFile(path, pt.Result, sum, meta); err != nil {
					saveErr = errors.Join(saveErr, err)
				} else {
					fmt.Fprintf(stderr, "bench: saved %s\n", path)
				}
			}
		},
	}, sweepTargets)
	fmt.Fprintln(stdout)
	if len(slos) == 0 {
		fmt.Fprintln(stdout, "No --slo or --goodput given: no SLO matrix and no winner.")
		fmt.Fprintln(stdout)
	}
	if werr := bench.WriteSweepComparison(stdout, sweeps, slos, p); werr != nil {
		saveErr = errors.Join(saveErr, werr)
	}
	if *f.report != "" && len(sweeps) > 0 {
		in := bench.ReportInput{Title: "gpurouter rate sweep", Notes: []string{runNote(s.meta, s.cfg)},
			Sweeps: sweeps, SLOs: slos, SLOPercentile: p}
		if writeReport(*f.report, in, stderr) != 0 {
			saveErr = errors.Join(saveErr, errors.New("report not written"))
		}
	}
	if err := errors.Join(err, saveErr); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	return 0
}

// rateString writes a request rate as the flags take it.
func rateString(r float64) string {
	if r <= 0 || math.IsInf(r, 1) {
		return "inf"
	}
	return fmt.Sprint(r)
}
