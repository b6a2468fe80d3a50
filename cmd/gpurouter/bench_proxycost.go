package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/gpurouter/gpurouter/bench/proxycost"
)

// runBenchProxyCost is `gpurouter bench proxy-cost`: the data plane's CPU
// per request and per SSE event, memory per idle stream and added latency,
// next to direct, HAProxy and nginx (bench/proxycost).
func runBenchProxyCost(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench proxy-cost", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gpurouter bench proxy-cost [flags]\n\n"+
			"Measures direct, this gpurouter (started with its defaults), and HAProxy and nginx when installed,\n"+
			"with one upstream and the same clients; prints a Markdown table and the issue-15 acceptance checks.")
		fs.PrintDefaults()
	}
	var cfg proxycost.Config
	var targets benchList
	noGpurouter := fs.Bool("no-gpurouter", false, "leave gpurouter out (measure only the other targets)")
	gpurouterBin := fs.String("gpurouter-bin", "", "the gpurouter binary to measure (default: this one)")
	fs.IntVar(&cfg.GpurouterProcs, "gpurouter-gomaxprocs", 0, "also measure gpurouter with GOMAXPROCS=N, as column gpurouter-pN (HAProxy and nginx run one thread)")
	fs.StringVar(&cfg.GpurouterCPUProfile, "gpurouter-cpu-profile", "", "FILE: the gpurouter column writes a CPU profile (pprof) of its whole run to FILE (serve --cpu-profile); how cmd/gpurouter/default.pgo is renewed")
	fs.BoolVar(&cfg.GpurouterGoroutines, "gpurouter-goroutines", false, "also measure gpurouter serving whole requests on fasthttp's goroutines instead of its request loops (serve --request-loops 0), as column gpurouter-goroutines")
	fs.BoolVar(&cfg.Bare, "bare", true, "measure a bare fasthttp reverse proxy too (column fasthttp-bare): the floor of the library gpurouter is built on")
	serveBare := fs.String("serve-bare", "", "LISTEN: run the bare fasthttp proxy on LISTEN in front of --upstream until SIGTERM (what --bare starts)")
	fs.BoolVar(&cfg.Loop, "loop", runtime.GOOS == "linux", "measure a Go proxy on its own epoll loop too (column epoll-bare, Linux): the floor of a Go data plane that bypasses the netpoller")
	serveLoop := fs.String("serve-loop", "", "LISTEN: run the epoll-loop proxy on LISTEN (HOST:PORT, IPv4) in front of --upstream until SIGTERM (what --loop starts)")
	fs.BoolVar(&cfg.HAProxy, "haproxy", true, "measure HAProxy when installed (1 thread, leastconn, option http-no-delay)")
	fs.BoolVar(&cfg.Nginx, "nginx", true, "measure nginx when installed (1 worker, proxy_buffering off, upstream keepalive)")
	fs.Var(&targets, "target", "NAME=HOST:PORT[,pid=PID]: a proxy already running in front of --upstream (repeatable); with pid= its CPU and memory are measured")
	fs.StringVar(&cfg.UpstreamAddr, "upstream", "", "HOST:PORT for the harness's fake engine (default: a free loopback port); needed by --target proxies")
	fs.IntVar(&cfg.Reps, "reps", 3, "interleaved repetitions; each figure is their median")
	fs.DurationVar(&cfg.Duration, "duration", 3*time.Second, "one c=64 or SSE run")
	fs.DurationVar(&cfg.C1Duration, "c1-duration", 2*time.Second, "one c=1 run")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "closed-loop clients of the throughput run")
	fs.IntVar(&cfg.Streams, "streams", 64, "concurrent SSE streams")
	fs.IntVar(&cfg.IdleStreams, "idle-streams", 1000, "idle streams held open for the memory figure")
	fs.DurationVar(&cfg.Interval, "interval", 5*time.Millisecond, "between two events of a stream")
	fs.IntVar(&cfg.Events, "events", 100, "events per SSE stream")
	fs.IntVar(&cfg.RequestBytes, "request-bytes", 300, "size of the chat request, whole and streamed (its message padded with words)")
	fs.IntVar(&cfg.ReplyBytes, "reply-bytes", 500, "size of the upstream's whole reply (its content padded with words)")
	fs.DurationVar(&cfg.QuietCPU, "quiet-cpu", 150*time.Millisecond, "a run is noisy (rerun) when other processes used more CPU than this")
	fs.IntVar(&cfg.Retries, "retries", 2, "reruns of a noisy run before keeping the quietest, marked noisy (-1: none)")
	fs.DurationVar(&cfg.Warmup, "warmup", time.Second, "warm-up per target before the first rep")
	fs.DurationVar(&cfg.IdleHold, "idle-hold", 0, "keep the idle streams open this long after reading the RSS (to profile the proxy meanwhile)")
	workloads := fs.String("workloads", strings.Join(proxycost.WorkloadNames(), ","), "the workloads measured, comma-separated: c1, c64, sse, idle (c1 alone: a fifth of a whole run's time, to compare builds at c=1 over more reps)")
	jsonOut := fs.String("json", "", "also write the figures as JSON to this file")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench proxy-cost: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if w, err := proxycost.ParseWorkloads(*workloads); err != nil {
		fmt.Fprintf(stderr, "bench proxy-cost: --workloads: %v\n", err)
		return 2
	} else if len(w) < len(proxycost.WorkloadNames()) {
		cfg.Workloads = w
	}
	if *serveLoop != "" {
		if cfg.UpstreamAddr == "" {
			fmt.Fprintln(stderr, "bench proxy-cost: --serve-loop needs --upstream HOST:PORT")
			return 2
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := proxycost.ServeLoop(ctx, *serveLoop, cfg.UpstreamAddr); err != nil {
			fmt.Fprintf(stderr, "bench proxy-cost: %v\n", err)
			return 1
		}
		return 0
	}
	if *serveBare != "" {
		if cfg.UpstreamAddr == "" {
			fmt.Fprintln(stderr, "bench proxy-cost: --serve-bare needs --upstream HOST:PORT")
			return 2
		}
		ln, err := net.Listen("tcp", *serveBare)
		if err != nil {
			fmt.Fprintf(stderr, "bench proxy-cost: %v\n", err)
			return 1
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := proxycost.ServeBare(ctx, ln, cfg.UpstreamAddr); err != nil {
			fmt.Fprintf(stderr, "bench proxy-cost: %v\n", err)
			return 1
		}
		return 0
	}
	for _, spec := range targets {
		t, err := proxycost.ExternalTarget(spec)
		if err != nil {
			fmt.Fprintf(stderr, "bench proxy-cost: %v\n", err)
			return 2
		}
		cfg.External = append(cfg.External, t)
	}
	if len(cfg.External) > 0 && cfg.UpstreamAddr == "" {
		fmt.Fprintln(stderr, "bench proxy-cost: --target needs --upstream HOST:PORT, the address its proxy forwards to")
		return 2
	}
	if !*noGpurouter {
		bin := *gpurouterBin
		if bin == "" {
			self, err := os.Executable()
			if err != nil {
				fmt.Fprintf(stderr, "bench proxy-cost: %v\n", err)
				return 1
			}
			bin = self
		}
		cfg.Gpurouter = []string{bin}
	}
	if cfg.Retries < 0 {
		cfg.Retries = -1
	}
	if !*quiet {
		cfg.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := proxycost.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "bench proxy-cost: %v\n", err)
		return 1
	}
	res.WriteMarkdown(stdout)
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err == nil {
			err = errors.Join(res.WriteJSON(f), f.Close())
		}
		if err != nil {
			fmt.Fprintf(stderr, "bench proxy-cost: %v\n", err)
			return 1
		}
	}
	return 0
}
