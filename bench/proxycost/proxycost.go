// Package proxycost is the data-plane cost harness of `gpurouter bench
// proxy-cost`: the same fasthttp upstream, the same clients and the same
// /proc accounting for every proxy measured — direct (no proxy), gpurouter
// started with its defaults, HAProxy and nginx when installed, and any
// proxy a user points it at. It measures CPU per request and per SSE
// event from the proxy's utime+stime, memory per idle stream from its RSS,
// added latency against direct, and whether events stay apart (no
// coalescing); reps are interleaved across targets, each figure is a
// median, and a run is retried (a bounded number of times) when other
// processes on the box used more CPU than the quiet-box threshold.
package proxycost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Config is one harness run. Zero fields take the defaults noted.
type Config struct {
	// Gpurouter is the command that runs gpurouter (its "serve" arguments
	// are appended); nil leaves gpurouter out.
	Gpurouter []string
	// GpurouterProcs, when positive, adds a second gpurouter column run
	// with GOMAXPROCS set to it ("gpurouter-pN"): HAProxy and nginx are
	// measured with one thread, the Go runtime with one P per core.
	GpurouterProcs int
	// GpurouterGoroutines adds a gpurouter column that serves whole
	// requests on fasthttp's goroutines instead of its request loops
	// ("gpurouter-goroutines"; serve --request-loops 0).
	GpurouterGoroutines bool
	// GpurouterCPUProfile, when set, is where the gpurouter column writes
	// a CPU profile of its whole run (serve --cpu-profile): the workload
	// cmd/gpurouter/default.pgo is renewed from.
	GpurouterCPUProfile string
	// Bare adds a column for a bare fasthttp reverse proxy (ServeBare),
	// started from the Gpurouter command: the floor of the library.
	Bare bool
	// Loop adds a column for a Go proxy on its own epoll loop (ServeLoop,
	// Linux only), started from the Gpurouter command: the floor of a Go
	// data plane that does not go through the netpoller.
	Loop bool
	// HAProxy and Nginx add those proxies when installed (a note says so
	// when they are not).
	HAProxy, Nginx bool
	// External are proxies already running, forwarding to the upstream at
	// UpstreamAddr (the harness prints it and waits for nothing).
	External []Target
	// UpstreamAddr is where the fake engine listens; "" picks a free
	// loopback port. External proxies need it fixed.
	UpstreamAddr string

	Reps        int           // interleaved repetitions, a median taken over them [3]
	Duration    time.Duration // one c=64 or SSE run [3s]
	C1Duration  time.Duration // one c=1 run [2s]
	Concurrency int           // closed-loop clients of the throughput run [64]
	Streams     int           // concurrent SSE streams [64]
	IdleStreams int           // idle streams held for the memory figure [1000]
	Interval    time.Duration // between two events of a stream [5ms]
	Events      int           // events per SSE stream [100]
	// RequestBytes and ReplyBytes size the chat request (whole and
	// streamed) and the whole reply, their text padded with words [300,
	// 500]: what a proxy that reads bodies pays grows with them.
	RequestBytes, ReplyBytes int
	QuietCPU                 time.Duration // a run is noisy when other processes used more CPU than this [150ms]
	Retries                  int           // reruns of a noisy run before keeping the quietest [2]
	Warmup                   time.Duration // per target before the first rep [1s]
	// IdleHold keeps the idle streams open this long after their RSS is
	// read, to inspect the proxy (a heap profile) while they are [0].
	IdleHold time.Duration
	// Workloads are the workloads measured, by name (WorkloadNames);
	// nil measures all. Comparing two builds at c=1 alone takes a
	// fifth of a whole run, so more reps fit in the same time.
	Workloads []string

	Progress io.Writer // one line per run; nil means none
}

func (c Config) withDefaults() Config {
	set := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	setI := func(d *int, v int) {
		if *d == 0 {
			*d = v
		}
	}
	setI(&c.Reps, 3)
	set(&c.Duration, 3*time.Second)
	set(&c.C1Duration, 2*time.Second)
	setI(&c.Concurrency, 64)
	setI(&c.Streams, 64)
	setI(&c.IdleStreams, 1000)
	set(&c.Interval, 5*time.Millisecond)
	setI(&c.Events, 100)
	setI(&c.RequestBytes, 300)
	setI(&c.ReplyBytes, 500)
	set(&c.QuietCPU, 150*time.Millisecond)
	set(&c.Warmup, time.Second)
	if c.Retries == 0 {
		c.Retries = 2
	}
	if c.Retries < 0 {
		c.Retries = 0
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

// WorkloadNames are the names Config.Workloads takes, in the order a rep
// runs them: c=1, c=64 (Concurrency), the SSE streams and the idle
// streams' memory.
func WorkloadNames() []string { return []string{"c1", "c64", "sse", "idle"} }

// ParseWorkloads reads a comma-separated list of WorkloadNames.
func ParseWorkloads(list string) ([]string, error) {
	var out []string
	names := WorkloadNames()
	for w := range strings.SplitSeq(list, ",") {
		w = strings.TrimSpace(w)
		if !slices.Contains(names, w) {
			return nil, fmt.Errorf("unknown workload %q (want some of %s)", w, strings.Join(names, ","))
		}
		if !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out, nil
}

// measures reports whether the run measures workload w (one of WorkloadNames).
func (c Config) measures(w string) bool {
	return len(c.Workloads) == 0 || slices.Contains(c.Workloads, w)
}

// Run starts the upstream and the targets, measures, stops everything it
// started and returns the figures.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg = cfg.withDefaults()
	for _, w := range cfg.Workloads {
		if !slices.Contains(WorkloadNames(), w) {
			return nil, fmt.Errorf("proxycost: unknown workload %q", w)
		}
	}
	up := newUpstream(cfg.Interval, cfg.Events, chatReply(cfg.ReplyBytes), time.Now)
	if err := up.listen(cfg.UpstreamAddr); err != nil {
		return nil, fmt.Errorf("proxycost: upstream: %w", err)
	}
	defer up.stop()
	fmt.Fprintf(cfg.Progress, "upstream on %s\n", up.addr())

	res := &Result{Config: cfg, Started: time.Now(), Box: machine()}
	targets := []Target{{Name: "direct", Addr: up.addr()}}
	defer func() {
		for i := range targets {
			targets[i].stop()
		}
	}()
	if cfg.Gpurouter != nil {
		var flags []string
		if cfg.GpurouterCPUProfile != "" {
			// Absolute: the target runs in a directory of its own, removed
			// when it stops.
			path, err := filepath.Abs(cfg.GpurouterCPUProfile)
			if err != nil {
				return nil, err
			}
			flags = []string{"--cpu-profile", path}
		}
		t, err := startGpurouter(ctx, "gpurouter", cfg.Gpurouter, nil, flags, up.addr())
		if err != nil {
			return nil, err
		}
		targets = append(targets, t)
		if cfg.GpurouterProcs > 0 {
			name := fmt.Sprintf("gpurouter-p%d", cfg.GpurouterProcs)
			t, err := startGpurouter(ctx, name, cfg.Gpurouter, []string{fmt.Sprintf("GOMAXPROCS=%d", cfg.GpurouterProcs)}, nil, up.addr())
			if err != nil {
				return nil, err
			}
			targets = append(targets, t)
		}
		if cfg.GpurouterGoroutines {
			t, err := startGpurouter(ctx, "gpurouter-goroutines", cfg.Gpurouter, nil, []string{"--request-loops", "0"}, up.addr())
			if err != nil {
				return nil, err
			}
			targets = append(targets, t)
		}
	}
	if cfg.Bare && cfg.Gpurouter != nil {
		t, err := StartBare(ctx, cfg.Gpurouter, up.addr())
		if err != nil {
			return nil, err
		}
		targets = append(targets, t)
	}
	if cfg.Loop && cfg.Gpurouter != nil {
		t, err := StartLoop(ctx, cfg.Gpurouter, up.addr())
		if err != nil {
			return nil, err
		}
		targets = append(targets, t)
	}
	starts := []struct {
		on    bool
		start func(context.Context, string) (Target, error)
	}{{cfg.HAProxy, StartHAProxy}, {cfg.Nginx, StartNginx}}
	for _, s := range starts {
		if !s.on {
			continue
		}
		t, err := s.start(ctx, up.addr())
		if errors.Is(err, ErrNotInstalled) {
			res.Notes = append(res.Notes, err.Error()+": its column is left out")
			continue
		}
		if err != nil {
			return nil, err
		}
		targets = append(targets, t)
	}
	targets = append(targets, cfg.External...)

	m := &measurer{cfg: cfg, up: up, res: res, request: chatRequest(cfg.RequestBytes, false), sseRq: chatRequest(cfg.RequestBytes, true)}
	for i := range targets {
		res.Targets = append(res.Targets, &TargetResult{Name: targets[i].Name, measured: len(targets[i].PIDs) > 0})
		if err := m.warm(ctx, &targets[i], res.Targets[i]); err != nil {
			return nil, fmt.Errorf("proxycost: %s: %w", targets[i].Name, err)
		}
	}
	for rep := range cfg.Reps {
		// Each rep starts at another target, so none is always measured
		// first (or right after the same neighbour).
		for k := range targets {
			i := (k + rep) % len(targets)
			if err := m.rep(ctx, &targets[i], res.Targets[i], rep); err != nil {
				return nil, fmt.Errorf("proxycost: %s: %w", targets[i].Name, err)
			}
		}
	}
	res.Elapsed = time.Since(res.Started)
	return res, ctx.Err()
}

// measurer runs the workloads against one target at a time.
type measurer struct {
	cfg            Config
	up             *upstream
	res            *Result
	request, sseRq []byte // the chat request, whole and streamed (Config.RequestBytes)
}

// warm sends a little of every workload through a target so that lazy
// setup (connection pools, buffers, JIT-less but cold caches) is not
// billed to the first run, and reads its warmed-up size for the memory
// figure.
func (m *measurer) warm(ctx context.Context, t *Target, tr *TargetResult) error {
	// A proxy may take a while to see the upstream healthy (a user's
	// proxy started before the harness's upstream): wait up to 30 s for a
	// first answer.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if r := closedLoop(ctx, t.Addr, m.request, 1, 50*time.Millisecond); r.requests > 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("no answer from the target within 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	r := closedLoop(ctx, t.Addr, m.request, m.cfg.Concurrency, m.cfg.Warmup/2)
	if r.requests == 0 {
		return fmt.Errorf("no request got through in the warm-up (%d errors)", r.errors)
	}
	s := sseLoop(ctx, t.Addr, m.sseRq, min(8, m.cfg.Streams), m.cfg.Warmup/2, m.cfg.Interval)
	if s.streams == 0 {
		return fmt.Errorf("no stream got through in the warm-up (%d errors)", s.errors)
	}
	if len(t.PIDs) > 0 {
		rss, err := sumRSS(t.PIDs)
		if err != nil {
			return err
		}
		tr.baseRSS = rss
	}
	return nil
}

func sumRSS(pids []int) (int64, error) {
	var total int64
	for _, pid := range pids {
		r, err := procRSS(pid)
		if err != nil {
			return 0, err
		}
		total += r
	}
	return total, nil
}

// rep is one repetition of every workload measured on one target.
func (m *measurer) rep(ctx context.Context, t *Target, tr *TargetResult, rep int) error {
	kinds := []struct {
		workload, name string
		run            func(context.Context, *Target, *sample) error
	}{
		{"c1", "c=1", m.runC1},
		{"c64", "c=64", m.runC64},
		{"sse", "sse", m.runSSE},
	}
	for _, k := range kinds {
		if !m.cfg.measures(k.workload) {
			continue
		}
		var best *sample
		for attempt := 0; attempt <= m.cfg.Retries; attempt++ {
			s := &sample{}
			meter, err := startCPU(t.PIDs)
			if err != nil {
				return err
			}
			if err := k.run(ctx, t, s); err != nil {
				return fmt.Errorf("%s: %w", k.name, err)
			}
			proxy, others, boxOthers, err := meter.stop()
			if err != nil {
				return err
			}
			s.proxyCPU, s.others, s.boxOthers = proxy, others, boxOthers
			s.noisy = boxOthers > m.cfg.QuietCPU
			m.res.Runs++
			fmt.Fprintf(m.cfg.Progress, "rep %d %-10s %-5s %s\n", rep+1, t.Name, k.name, s.line())
			if best == nil || s.boxOthers < best.boxOthers {
				best = s
			}
			if !s.noisy {
				break
			}
			if attempt < m.cfg.Retries {
				m.res.Discarded++
			}
		}
		if best.noisy {
			m.res.KeptNoisy++
			tr.noisy = append(tr.noisy, fmt.Sprintf("%s rep %d", k.name, rep+1))
		}
		tr.add(k.name, best)
	}
	if len(t.PIDs) == 0 || !m.cfg.measures("idle") {
		return nil // direct has no memory of its own; or the idle streams are not measured
	}
	var rss int64
	var rerr error
	idle := idleStreams(ctx, t.Addr, m.sseRq, m.cfg.IdleStreams, func() {
		time.Sleep(200 * time.Millisecond) // let the last ones settle in the proxy
		rss, rerr = sumRSS(t.PIDs)
		if m.cfg.IdleHold > 0 {
			fmt.Fprintf(m.cfg.Progress, "rep %d %-10s idle  holding %d streams for %s\n", rep+1, t.Name, m.cfg.IdleStreams, m.cfg.IdleHold)
			time.Sleep(m.cfg.IdleHold)
		}
		m.up.release()
	})
	if rerr != nil {
		return rerr
	}
	if idle.opened < m.cfg.IdleStreams*9/10 {
		return fmt.Errorf("idle: only %d of %d streams opened", idle.opened, m.cfg.IdleStreams)
	}
	tr.idleRSS = append(tr.idleRSS, float64(rss-tr.baseRSS)/1024/float64(idle.opened))
	fmt.Fprintf(m.cfg.Progress, "rep %d %-10s idle  %d streams, RSS %.1f MiB (warm %.1f MiB)\n", rep+1, t.Name, idle.opened, float64(rss)/(1<<20), float64(tr.baseRSS)/(1<<20))
	return nil
}

func (m *measurer) runC1(ctx context.Context, t *Target, s *sample) error {
	r := closedLoop(ctx, t.Addr, m.request, 1, m.cfg.C1Duration)
	if err := checkErrors(r.errors, r.requests); err != nil {
		return err
	}
	s.count, s.elapsed, s.p50 = r.requests, r.elapsed, percentile(r.lat, 0.5)
	return nil
}

func (m *measurer) runC64(ctx context.Context, t *Target, s *sample) error {
	r := closedLoop(ctx, t.Addr, m.request, m.cfg.Concurrency, m.cfg.Duration)
	if err := checkErrors(r.errors, r.requests); err != nil {
		return err
	}
	s.count, s.elapsed, s.p50 = r.requests, r.elapsed, percentile(r.lat, 0.5)
	return nil
}

func (m *measurer) runSSE(ctx context.Context, t *Target, s *sample) error {
	r := sseLoop(ctx, t.Addr, m.sseRq, m.cfg.Streams, m.cfg.Duration, m.cfg.Interval)
	if err := checkErrors(r.errors, r.streams); err != nil {
		return err
	}
	s.count, s.elapsed = r.events, r.elapsed
	s.p50 = percentile(r.delay, 0.5)
	s.gapP50 = percentile(r.gaps, 0.5)
	if len(r.gaps) > 0 {
		s.coalesced = float64(r.coalesced) / float64(len(r.gaps))
	}
	return nil
}

// checkErrors fails a run where more than 1% of the work failed: its
// figures would describe the failures.
func checkErrors(errs, ok int) error {
	if ok == 0 || errs*100 > ok {
		return fmt.Errorf("%d failed, %d succeeded", errs, ok)
	}
	return nil
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// hostname is for the report's header.
func hostname() string {
	h, _ := os.Hostname()
	return h
}
