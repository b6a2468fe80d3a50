package main

import (
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/fleet"
	"github.com/gpurouter/gpurouter/kvevents"
	"github.com/gpurouter/gpurouter/proxy"
	"github.com/gpurouter/gpurouter/tracing"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
)

// router is the wiring of `serve`: the proxy, and the fleet that owns its
// live configuration and background loops, built from the file schema.
type router struct {
	srv   *proxy.Server
	fleet *fleet.Fleet
	log   *zap.Logger
	reg   *prometheus.Registry
	gpus  *gpuSources
	// tracer exports the requests' spans (tracing:); off without an
	// endpoint. run shuts it down after the drain.
	tracer *tracing.Tracer
	// sources are the discovery loops of the pools with discovery, built
	// from the configuration at start; run runs them.
	sources []runner

	// file is the configuration last applied from the file (or the
	// flags), admin edits aside: the rest of what --print-config and the
	// admin state show. Written under the fleet's lock, in change order.
	file atomic.Pointer[fileConfig]
}

// newRouter builds the router of cfg (defaults filled, validated). It
// starts nothing: run serves.
func newRouter(cfg fileConfig, log *zap.Logger) (*router, error) {
	return newRouterWith(cfg, log, routerDeps{})
}

// routerDeps are the optional parts of a router; the zero value has none.
type routerDeps struct {
	// access takes the proxy's common access log lines straight, without
	// zap (proxy.Options.AccessLog): serve's log writer when it writes
	// JSON at info level (logConfig.accessLog); nil: every line through
	// the logger.
	access io.Writer
	// prober runs the health checks; nil means an HTTP GET of health.path.
	prober balancer.Prober
}

// newRouterWith is newRouter with its optional parts.
func newRouterWith(cfg fileConfig, log *zap.Logger, deps routerDeps) (*router, error) {
	prober := deps.prober
	r := &router{log: log, reg: prometheus.NewRegistry(), gpus: newGPUSources(log)}
	am, err := admission.NewMetrics(r.reg)
	if err != nil {
		return nil, err
	}
	spec, err := r.spec(cfg)
	if err != nil {
		return nil, err
	}
	if prober == nil {
		prober = balancer.HTTPProber{Path: cfg.Health.Path}
	}
	r.fleet, err = fleet.New(spec, fleet.Options{
		Health: balancer.HealthConfig{
			Interval:           cfg.Health.Interval,
			Timeout:            cfg.Health.Timeout,
			UnhealthyThreshold: cfg.Health.UnhealthyThreshold,
			HealthyThreshold:   cfg.Health.HealthyThreshold,
			BusyGrace:          cfg.Health.BusyGrace,
		},
		Prober:           prober,
		AdmissionMetrics: am,
		KVEventsMetrics:  kvevents.NewMetrics(r.reg),
		DiscoveredGPU:    r.discoveredGPU,
		Log:              log,
	})
	if err != nil {
		return nil, err
	}
	if r.sources, err = r.discoverySources(cfg); err != nil {
		return nil, err
	}
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), r.fleet.Collector())
	keys, err := newKeyStore(cfg)
	if err != nil {
		return nil, err
	}
	if r.tracer, err = newTracer(cfg.Tracing, log); err != nil {
		return nil, err
	}
	r.srv, err = proxy.New(proxy.Options{
		Config: proxy.Config{
			ConnectTimeout:     cfg.Timeouts.Connect,
			FirstByteTimeout:   cfg.Timeouts.FirstByte,
			IdleTimeout:        cfg.Timeouts.Idle,
			TotalTimeout:       cfg.Timeouts.Total,
			MaxBodyBytes:       cfg.Limits.MaxBodyBytes,
			MaxHeaderBytes:     cfg.Limits.MaxHeaderBytes,
			ReadTimeout:        cfg.Limits.ReadTimeout,
			MaxConnections:     cfg.Limits.MaxConnections,
			MaxAttempts:        cfg.Retry.MaxAttempts,
			BackoffBase:        cfg.Retry.BackoffBase,
			BackoffMax:         cfg.Retry.BackoffMax,
			MaxConnsPerReplica: cfg.Upstream.MaxConnsPerReplica,
			MaxIdleConnTime:    cfg.Upstream.MaxIdleConnTime,
			MaxUpstreamHeader:  cfg.Upstream.MaxHeaderBytes,
			GoroutineStreams:   cfg.Upstream.GoroutineStreams,
			StreamLoops:        cfg.Upstream.StreamLoops,
			GoroutineRequests:  cfg.Upstream.GoroutineRequests,
			RequestLoops:       cfg.Upstream.RequestLoops,
			UnbatchedIO:        cfg.Upstream.UnbatchedIO,
		},
		Routes:      r.fleet.Routes(),
		Score:       scoreConfig(cfg),
		Keys:        keys,            // nil: no client auth
		StatusToken: cfg.Admin.Token, // the status page shows what the admin API does: behind its token
		Registerer:  r.reg,
		Gatherer:    r.reg,
		Logger:      log,
		AccessLog:   deps.access,
		Tracer:      r.tracer,
	})
	if err == nil {
		err = r.fleet.Attach(r.srv)
	}
	if err != nil {
		r.tracer.Shutdown(context.Background()) //nolint:errcheck // the error said is err
		return nil, err
	}
	r.file.Store(&cfg)
	return r, nil
}

// reload applies a new, already validated configuration without dropping
// requests in flight.
func (r *router) reload(cfg fileConfig) error {
	return r.reloadFrom(func() (fileConfig, error) { return cfg, nil })
}

// reloadFrom applies the configuration load returns: the path of SIGHUP
// and POST /admin/reload, where load re-reads the file. It runs as one
// fleet change, so the file is read when the reload takes effect: an admin
// edit is never undone by a file read before it. Options that only take
// effect at start (listen address, timeouts, limits, retries, upstream,
// breaker, health, log) are reported, not applied.
func (r *router) reloadFrom(load func() (fileConfig, error)) error {
	var cfg fileConfig
	var applyKeys func()
	return r.fleet.Update(fleet.Change{
		Next: func(cur fleet.Spec) (fleet.Spec, error) {
			var err error
			if cfg, err = load(); err != nil {
				return fleet.Spec{}, err
			}
			if applyKeys, err = prepareKeys(r.srv, cfg); err != nil {
				return fleet.Spec{}, err
			}
			next, err := r.spec(cfg)
			keepDiscovered(&next, cur)
			return next, err
		},
		Applied: func() {
			old := r.file.Swap(&cfg)
			applyKeys()
			if fixed := restartOnly(*old, cfg); len(fixed) > 0 {
				r.log.Warn("configuration reloaded; these options take effect only at restart", zap.Strings("options", fixed))
			} else {
				r.log.Info("configuration reloaded", zap.Int("pools", len(cfg.Pools)))
			}
		},
	})
}

// config is the configuration last applied from the file (or the flags).
func (r *router) config() fileConfig { return *r.file.Load() }

// restartOnly lists the top-level options that differ and need a restart.
func restartOnly(a, b fileConfig) []string {
	var out []string
	for _, f := range []struct {
		name string
		a, b any
	}{
		{"listen", a.Listen, b.Listen}, {"log", a.Log, b.Log}, {"timeouts", a.Timeouts, b.Timeouts},
		{"limits", a.Limits, b.Limits}, {"retry", a.Retry, b.Retry}, {"upstream", a.Upstream, b.Upstream},
		{"health", a.Health, b.Health}, {"breaker", a.Breaker, b.Breaker}, {"shutdown", a.Shutdown, b.Shutdown},
		{"tracing", a.Tracing, b.Tracing},
	} {
		if !reflect.DeepEqual(f.a, f.b) {
			out = append(out, f.name)
		}
	}
	if !sameDiscovery(a, b) {
		out = append(out, "pools[].discovery")
	}
	return out
}

// runner is a background loop: the fleet, the admin API, the SIGHUP
// reloader.
type runner interface {
	Run(ctx context.Context) error
}

// run serves until ctx ends, then drains for up to drain. The fleet's
// loops and the side loops given run meanwhile (through the drain: queued
// requests still need their admission controller); run returns once every
// one has returned.
func (r *router) run(ctx context.Context, ln net.Listener, drain time.Duration, side ...runner) error {
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, l := range append(append([]runner{r.fleet}, r.sources...), side...) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Run(bg); err != nil {
				r.log.Error("background loop", zap.Error(err))
			}
		}()
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- r.srv.Serve(ln) }()

	var err error
	select {
	case err = <-serveErr:
	case <-ctx.Done():
		r.log.Info("shutting down: draining in-flight requests", zap.Duration("drain_timeout", drain), zap.Int64("active", r.srv.Active()))
		dctx, cancel := context.WithTimeout(context.Background(), drain)
		err = r.srv.Shutdown(dctx)
		cancel()
		<-serveErr
	}
	stopBG()
	wg.Wait()
	// The spans of the requests drained are exported before the process
	// ends (within tracing.timeout).
	if terr := r.tracer.Shutdown(context.Background()); terr != nil {
		r.log.Warn("tracing: spans not exported at shutdown", zap.Error(terr))
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// admin is the operators' API over r's fleet, serving on ln; reload is
// POST /admin/reload.
func (r *router) admin(ln net.Listener, token string, reload func() error) *fleet.Admin {
	return fleet.NewAdmin(r.fleet, ln, fleet.AdminOptions{
		Token:  token,
		Reload: reload,
		Render: r.renderConfig,
		Active: r.srv.Active,
		Log:    r.log,
	})
}
