package gpu

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Poller defaults (PollerConfig's zero values).
const (
	DefaultInterval    = 200 * time.Millisecond // engine scrape period
	DefaultTimeout     = 500 * time.Millisecond // one engine scrape
	DefaultGPUInterval = time.Second            // GPU read period (NVML/DCGM sample at ~1 s anyway)
	DefaultGPUTimeout  = time.Second            // one GPU read
)

// PollerConfig tunes a Poller. Every zero value means the default.
type PollerConfig struct {
	// Interval is the engine scrape period per replica (default 200ms).
	Interval time.Duration
	// Timeout bounds one engine scrape (default 500ms). A scrape past it
	// fails; the loop then waits for the next tick.
	Timeout time.Duration
	// SlowAfter marks a scrape that succeeded but took longer as slow: it
	// is published, counted and logged (default Interval).
	SlowAfter time.Duration
	// GPUInterval is the GPU read period per replica (default 1s).
	GPUInterval time.Duration
	// GPUTimeout bounds one GPU read (default 1s).
	GPUTimeout time.Duration
	// NoMetricsRetryMax is the longest wait between engine scrapes of a
	// replica that exposes no engine metrics the router reads (an unknown
	// engine, metrics not enabled): such scrapes wait twice Interval, then
	// twice as long each time, up to this (default 1m).
	NoMetricsRetryMax time.Duration
	// Clock stamps snapshots and makes tickers; nil means real time.
	Clock Clock
	// Log receives one line per change of a target's scrape state (ok,
	// slow, failing) and one when its engine is found or found missing,
	// never one per tick; nil means no logging.
	Log *zap.Logger
}

func (c PollerConfig) withDefaults() PollerConfig {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.SlowAfter <= 0 {
		c.SlowAfter = c.Interval
	}
	if c.GPUInterval <= 0 {
		c.GPUInterval = DefaultGPUInterval
	}
	if c.GPUTimeout <= 0 {
		c.GPUTimeout = DefaultGPUTimeout
	}
	if c.NoMetricsRetryMax <= 0 {
		c.NoMetricsRetryMax = DefaultNoMetricsRetryMax
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	return c
}

// Target is one replica's telemetry binding.
type Target struct {
	Name   string       // replica name in logs and metrics; required, unique
	Engine EngineSource // the replica's engine /metrics (NewEngineSource); nil for none
	GPU    Source       // the replica's GPUs; nil for none
	Sink   Sink         // where snapshots go, usually the *balancer.Replica; required
}

// Poller keeps every target's telemetry fresh: per target, one loop scrapes
// the engine every Interval and one reads the GPUs every GPUInterval, each
// publishing an immutable snapshot to the target's Sink. Failed and slow
// scrapes are counted (Health, Collector) and logged once per state change.
// Build with NewPoller; nothing runs until Run.
type Poller struct {
	cfg     PollerConfig
	targets []*target
}

// target is a Target with its two loops' state.
type target struct {
	Target
	engine, gpu loopState
	prevEngine  *EngineStats    // guarded by engine.mu
	disc        engineDiscovery // guarded by engine.mu
}

// NewPoller validates the targets and fills cfg's defaults. It starts nothing.
func NewPoller(cfg PollerConfig, targets []Target) (*Poller, error) {
	p := &Poller{cfg: cfg.withDefaults()}
	var errs []error
	seen := make(map[string]bool, len(targets))
	for i, t := range targets {
		switch {
		case t.Name == "":
			errs = append(errs, fmt.Errorf("gpu: target %d: Name is required", i))
		case seen[t.Name]:
			errs = append(errs, fmt.Errorf("gpu: target %d: duplicate name %q", i, t.Name))
		case t.Sink == nil:
			errs = append(errs, fmt.Errorf("gpu: target %q: Sink is required", t.Name))
		}
		seen[t.Name] = true
		p.targets = append(p.targets, &target{Target: t})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// Run polls until ctx is done, then waits for every in-flight scrape and
// returns nil. Each loop scrapes once at start, then on every tick; a
// scrape that outlasts its period delays the next instead of piling up.
func (p *Poller) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, t := range p.targets {
		if t.Engine != nil {
			wg.Go(func() { p.loop(ctx, p.cfg.Interval, func() { p.pollEngine(ctx, t) }) })
		}
		if t.GPU != nil {
			wg.Go(func() { p.loop(ctx, p.cfg.GPUInterval, func() { p.pollGPU(ctx, t) }) })
		}
	}
	wg.Wait()
	return nil
}

func (p *Poller) loop(ctx context.Context, every time.Duration, poll func()) {
	tk := p.cfg.Clock.NewTicker(every)
	defer tk.Stop()
	for {
		poll()
		select {
		case <-ctx.Done():
			return
		case <-tk.C():
		}
	}
}

// PollOnce scrapes every target's engine and GPUs once, concurrently, and
// returns when all are done: a synchronous first round before serving, and
// what tests drive. Safe to call while Run runs (each target's scrapes are
// serialised).
func (p *Poller) PollOnce(ctx context.Context) {
	var wg sync.WaitGroup
	for _, t := range p.targets {
		if t.Engine != nil {
			wg.Go(func() { p.pollEngine(ctx, t) })
		}
		if t.GPU != nil {
			wg.Go(func() { p.pollGPU(ctx, t) })
		}
	}
	wg.Wait()
}

func (p *Poller) pollEngine(ctx context.Context, t *target) {
	t.engine.mu.Lock()
	defer t.engine.mu.Unlock()
	if t.engine.state.Load() == uint32(StateOff) {
		return
	}
	start := p.cfg.Clock.Now()
	if !t.disc.due(start) {
		return // no engine metrics there last time: backing off (discover)
	}
	var s *EngineStats
	err := fetchSafely(ctx, p.cfg.Timeout, func(ctx context.Context) (err error) {
		s, err = t.Engine.Fetch(ctx)
		return err
	})
	end := p.cfg.Clock.Now()
	if ctx.Err() != nil {
		return // shutting down: neither a failure nor a snapshot
	}
	if err == nil && s == nil {
		err = errors.New("gpu: engine source returned no stats")
	}
	p.observe(t, kindEngine, &t.engine, end, end.Sub(start), err)
	p.discover(t, end, s, err)
	if err != nil {
		return
	}
	s.At, s.Latency = end, end.Sub(start)
	s.since(t.prevEngine)
	t.prevEngine = s
	t.Sink.StoreEngine(s)
}

func (p *Poller) pollGPU(ctx context.Context, t *target) {
	t.gpu.mu.Lock()
	defer t.gpu.mu.Unlock()
	if t.gpu.state.Load() == uint32(StateOff) {
		return
	}
	start := p.cfg.Clock.Now()
	var gpus []GPUStats
	err := fetchSafely(ctx, p.cfg.GPUTimeout, func(ctx context.Context) (err error) {
		gpus, err = t.GPU.Fetch(ctx)
		return err
	})
	end := p.cfg.Clock.Now()
	if ctx.Err() != nil {
		return
	}
	p.observe(t, kindGPU, &t.gpu, end, end.Sub(start), err)
	if err != nil {
		return
	}
	t.Sink.StoreGPU(&GPUSnapshot{GPUs: gpus, At: end, Latency: end.Sub(start)})
}

// fetchSafely runs fetch under a timeout and turns a panic in it into an
// error, so that one broken source cannot take the router down.
func fetchSafely(ctx context.Context, timeout time.Duration, fetch func(context.Context) error) (err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("gpu: telemetry source panicked: %v", r)
		}
	}()
	return fetch(ctx)
}
