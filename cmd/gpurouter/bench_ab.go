package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gpurouter/gpurouter/bench"
)

// abSides turns --targets and --arms into the two sides of an A/B run:
// two targets, two arms of one target (the arm in header armHeader), or
// two targets each with its arm.
func abSides(targets []benchTarget, arms []string, armHeader, baseURL string) ([2]bench.ABSide, []string) {
	var sides [2]bench.ABSide
	switch {
	case len(targets) > 2 || len(arms) > 2:
		return sides, []string{"bench ab compares two sides: give two --targets, two --arms, or both"}
	case len(targets) < 2 && len(arms) < 2:
		return sides, []string{"bench ab needs two sides: --targets A=URL,B=URL or --arms A,B (one router, policy arm per header)"}
	case len(arms) == 2 && armHeader == "":
		return sides, []string{"--header-arm must name a header"}
	}
	for i := range sides {
		side := &sides[i]
		switch len(targets) {
		case 2:
			side.Label, side.BaseURL = targets[i].label, targets[i].url
		case 1:
			side.BaseURL = targets[0].url
		default:
			side.BaseURL = baseURL
		}
		if len(arms) == 2 {
			side.Headers = map[string]string{armHeader: arms[i]}
			if side.Label == "" {
				side.Label = arms[i]
			} else {
				side.Label += "/" + arms[i]
			}
		}
	}
	if sides[0].Label == sides[1].Label {
		sides[0].Label, sides[1].Label = "A:"+sides[0].Label, "B:"+sides[1].Label
	}
	return sides, nil
}

// runBenchAB is `gpurouter bench ab`: the same request sequence, seed and
// arrival schedule against side A then side B, both vllm result blocks,
// and the side-by-side table with deltas and bootstrap intervals.
func runBenchAB(args []string, stdout, stderr io.Writer) int {
	f := newBenchFlags("bench ab", stderr,
		"usage: gpurouter bench ab (--targets A=URL,B=URL | [--base-url URL] --arms A,B [--header-arm NAME]) [bench flags]\n"+
			"Sends the same requests with the same arrival times to side A, then to side B, and compares P50/P99 TTFT, TPOT\n"+
			"and e2e with 95% bootstrap intervals of the difference B - A.")
	var targetsFlag benchList
	f.fs.Var(&targetsFlag, "targets", "the two sides as LABEL=URL, comma-separated or repeated")
	armsFlag := f.fs.String("arms", "", "two policy arms of one router, comma-separated; each side sends its arm in --header-arm")
	armHeader := f.fs.String("header-arm", bench.DefaultArmHeader, "header that selects the arm")
	abPercentiles := f.fs.String("ab-percentiles", "50,99", "percentiles of TTFT, TPOT and e2e to compare")
	resamples := f.fs.Int("bootstrap-resamples", 1000, "bootstrap resamples (B)")
	confidence := f.fs.Float64("confidence", 0.95, "confidence level of the intervals")
	bootSeed := f.fs.Uint64("bootstrap-seed", 0, "seed of the bootstrap resampling (default: --seed)")
	cooldown := f.fs.Duration("cooldown", 0, "pause between the two sides so queues drain")
	if !f.parse(args) {
		return 2
	}
	s, errs := f.resolve(stderr)
	if s == nil && len(errs) == 0 {
		return 1
	}
	targets, terrs := parseTargets(targetsFlag)
	errs = append(errs, terrs...)
	if len(targets) > 0 && len(f.baseURLs) > 1 {
		errs = append(errs, "give --targets or several --base-url, not both")
	}
	var arms []string
	for _, a := range strings.Split(*armsFlag, ",") {
		if a = strings.TrimSpace(a); a != "" {
			arms = append(arms, a)
		}
	}
	if len(arms) == 2 && arms[0] == arms[1] {
		errs = append(errs, fmt.Sprintf("--arms %q: the two arms are the same", *armsFlag))
	}
	if *resamples < 1 {
		errs = append(errs, fmt.Sprintf("--bootstrap-resamples %d: want at least 1", *resamples))
	}
	if !(*confidence > 0 && *confidence < 1) {
		errs = append(errs, fmt.Sprintf("--confidence %v: want a level in (0, 1)", *confidence))
	}
	if *cooldown < 0 {
		errs = append(errs, "--cooldown must not be negative")
	}
	ps, err := bench.ParseMetricPercentiles(*abPercentiles)
	if err != nil {
		errs = append(errs, "--ab-percentiles: "+optionText(err))
	}
	var sides [2]bench.ABSide
	if s != nil {
		var serrs []string
		sides, serrs = abSides(targets, arms, *armHeader, s.cfg.BaseURL)
		errs = append(errs, serrs...)
	}
	if len(errs) > 0 {
		return printErrors(stderr, errs)
	}
	if !f.set["bootstrap-seed"] {
		*bootSeed = s.cfg.Seed
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if code := f.load(ctx, s, sides[0].BaseURL, stderr); code != 0 {
		return code
	}
	fmt.Fprintf(stdout, "A/B: A = %s (%s), B = %s (%s); %d requests (%s, seed %d), rate %s, each side in turn\n",
		sides[0].Label, sideText(sides[0]), sides[1].Label, sideText(sides[1]), len(s.cfg.Requests), s.meta.Dataset, s.cfg.Seed, rateString(s.cfg.RequestRate))
	var outErr error
	ab, runErr := bench.RunAB(ctx, bench.ABConfig{
		Base: s.cfg, A: sides[0], B: sides[1], Metrics: s.mopts, Percentiles: ps, Cooldown: *cooldown,
		Bootstrap: bench.BootstrapOptions{Resamples: *resamples, Level: *confidence, Seed: *bootSeed},
		OnSide: func(arm bench.ABArm) {
			fmt.Fprintf(stdout, "\nSide %s\n", arm.Label)
			outErr = errors.Join(outErr, bench.WriteConsole(stdout, arm.Result, arm.Summary))
			if *f.saveResult {
				meta := s.meta
				meta.Label = arm.Label
				path := filepath.Join(*f.resultDir, bench.DefaultResultFilename(arm.Result, strings.ReplaceAll(arm.Label, "/", "-")))
				if err := saveResultFile(path, arm.Result, arm.Summary, meta); err != nil {
					outErr = errors.Join(outErr, err)
				} else {
					fmt.Fprintf(stderr, "bench: saved %s\n", path)
				}
			}
		},
	})
	if ab != nil {
		fmt.Fprintln(stdout)
		outErr = errors.Join(outErr, bench.WriteABMarkdown(stdout, ab))
		if *f.report != "" {
			in := bench.ReportInput{Title: "gpurouter A/B comparison", Notes: []string{runNote(s.meta, s.cfg)}, AB: ab}
			if writeReport(*f.report, in, stderr) != 0 {
				outErr = errors.Join(outErr, errors.New("report not written"))
			}
		}
	}
	if err := errors.Join(runErr, outErr); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	return 0
}

// sideText describes where a side sends its requests.
func sideText(s bench.ABSide) string {
	var hs []string
	for k, v := range s.Headers {
		hs = append(hs, k+": "+v)
	}
	if len(hs) == 0 {
		return s.BaseURL
	}
	return s.BaseURL + ", " + strings.Join(hs, ", ")
}
