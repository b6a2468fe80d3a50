package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
)

// router is a configured proxy and its background loops (health checks,
// telemetry poller, admission controllers). Its pools can be replaced while
// it serves (reload): requests in flight keep what they hold.
type router struct {
	srv    *proxy.Server
	health *balancer.HealthChecker
	log    *zap.Logger
	am     *admission.Metrics
	reg    *prometheus.Registry

	mu    sync.Mutex // serialises reloads and loop start/stop
	state atomic.Pointer[fleetState]

	// Background loops: bg is set by run; loops started before run are
	// started by run itself.
	bg        context.Context
	wg        sync.WaitGroup
	ctlCancel map[*admission.Controller]context.CancelFunc
	pollStop  context.CancelFunc
}

// fleetState is one configuration's pools and what serves them.
type fleetState struct {
	cfg      fileConfig
	pools    []*balancer.Pool
	replicas []*balancer.Replica
	adm      map[*balancer.Pool]*admission.Controller
	poller   *gpu.Poller // nil when telemetry is disabled
}

// newRouter translates the file schema into the packages' configs.
func newRouter(cfg fileConfig, log *zap.Logger) (*router, error) {
	r := &router{log: log, reg: prometheus.NewRegistry(), ctlCancel: map[*admission.Controller]context.CancelFunc{}}
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), pollerCollector{r})
	am, err := admission.NewMetrics(r.reg)
	if err != nil {
		return nil, err
	}
	r.am = am
	st, err := r.buildFleet(cfg, nil)
	if err != nil {
		return nil, err
	}
	keys, err := newKeyStore(cfg)
	if err != nil {
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
		},
		Routes:     st.routes(),
		Score:      scoreConfig(cfg),
		Keys:       keys, // nil: no client auth
		Registerer: r.reg,
		Gatherer:   r.reg,
		Logger:     log,
	})
	if err != nil {
		return nil, err
	}
	r.state.Store(st)
	r.health = balancer.NewHealthChecker(balancer.HealthConfig{
		Interval:           cfg.Health.Interval,
		Timeout:            cfg.Health.Timeout,
		UnhealthyThreshold: cfg.Health.UnhealthyThreshold,
		HealthyThreshold:   cfg.Health.HealthyThreshold,
		BusyGrace:          cfg.Health.BusyGrace,
	}, balancer.HTTPProber{Path: cfg.Health.Path}, func() []*balancer.Replica { return r.state.Load().replicas }, log)
	return r, nil
}

// buildFleet builds the pools, admission controllers and poller for cfg.
// With prev, it carries over every replica whose name, URL and weight are
// unchanged (its in-flight counts, breaker and telemetry stay) and every
// pool whose model, aliases and path prefix are unchanged (its admission
// queue stays; policy and replicas are updated in place).
func (r *router) buildFleet(cfg fileConfig, prev *fleetState) (*fleetState, error) {
	bc := balancer.BreakerConfig{
		ConsecutiveFailures: cfg.Breaker.ConsecutiveFailures,
		OpenTimeout:         cfg.Breaker.OpenTimeout,
		HalfOpenRequests:    cfg.Breaker.HalfOpenRequests,
	}
	score := scoreConfig(cfg)
	st := &fleetState{cfg: cfg}
	byPool := make([][]*balancer.Replica, len(cfg.Pools))
	for i, pc := range cfg.Pools {
		oldPool, oldReps := prev.pool(pc)
		var reps []*balancer.Replica
		for j, rc := range pc.Replicas {
			if old := oldReps[rc]; old != nil {
				reps = append(reps, old)
				continue
			}
			rep, err := balancer.NewReplica(balancer.ReplicaConfig{Name: rc.Name, URL: rc.URL, Weight: rc.Weight}, bc, nil)
			if err != nil {
				return nil, fmt.Errorf("pools[%d].replicas[%d]: %w", i, j, err)
			}
			reps = append(reps, rep)
		}
		var p *balancer.Pool
		// A pool's pickers were built with the routing weights: reuse it only
		// if they are unchanged.
		if oldPool != nil && reflect.DeepEqual(prev.cfg.Routing, cfg.Routing) {
			p = oldPool
			var err error
			if len(pc.Arms) > 0 {
				err = p.SetArms(arms(pc))
			} else {
				err = p.SetPolicy(pc.Policy)
			}
			if err != nil {
				return nil, fmt.Errorf("pools[%d]: %w", i, err)
			}
			p.SetReplicas(reps)
		} else {
			var err error
			p, err = balancer.NewPool(balancer.PoolConfig{
				Model: pc.Model, Aliases: pc.Aliases, PathPrefix: pc.PathPrefix, Policy: pc.Policy,
				Arms: arms(pc), Picker: balancer.PickerOptions{Score: score},
			}, reps)
			if err != nil {
				return nil, fmt.Errorf("pools[%d]: %w", i, err)
			}
		}
		st.pools = append(st.pools, p)
		st.replicas = append(st.replicas, reps...)
		byPool[i] = reps
	}
	if !cfg.Admission.Disabled {
		ac := admissionFrom(cfg.Admission)
		st.adm = make(map[*balancer.Pool]*admission.Controller, len(st.pools))
		for _, p := range st.pools {
			if ctl, ok := prev.admissionOf(p); ok && reflect.DeepEqual(prev.cfg.Admission, cfg.Admission) {
				st.adm[p] = ctl
				continue
			}
			ctl, err := admission.New(p.Model(), ac, admission.Deps{Pool: p, Metrics: r.am})
			if err != nil {
				return nil, err
			}
			st.adm[p] = ctl
		}
	}
	var err error
	st.poller, err = newPoller(cfg, st.pools, byPool, st.adm, r.log)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// pool finds the previous pool serving the same routes as pc, and its
// replicas by configuration.
func (st *fleetState) pool(pc poolConfig) (*balancer.Pool, map[replicaConfig]*balancer.Replica) {
	if st == nil {
		return nil, nil
	}
	for i, old := range st.cfg.Pools {
		if old.Model != pc.Model || old.PathPrefix != pc.PathPrefix || !reflect.DeepEqual(old.Aliases, pc.Aliases) {
			continue
		}
		reps := map[replicaConfig]*balancer.Replica{}
		for j, rc := range old.Replicas {
			rc.GPU = nil // a changed GPU binding keeps the replica; the poller is rebuilt anyway
			reps[rc] = st.pools[i].Replicas()[j]
		}
		keyed := map[replicaConfig]*balancer.Replica{}
		for _, rc := range pc.Replicas {
			k := rc
			k.GPU = nil
			if rep := reps[k]; rep != nil {
				keyed[rc] = rep
			}
		}
		return st.pools[i], keyed
	}
	return nil, nil
}

func (st *fleetState) admissionOf(p *balancer.Pool) (*admission.Controller, bool) {
	if st == nil {
		return nil, false
	}
	ctl, ok := st.adm[p]
	return ctl, ok
}

// routes are the state's pools as the proxy serves them: each with its
// admission controller (nil when admission is off) and output cap.
func (st *fleetState) routes() []proxy.Route {
	out := make([]proxy.Route, len(st.pools))
	for i, p := range st.pools {
		out[i] = proxy.Route{Pool: p, Admission: st.adm[p], MaxTokens: st.cfg.Pools[i].MaxTokensLimit}
	}
	return out
}

// reload applies a new, already validated configuration without dropping
// requests in flight. Options that only take effect at start (listen
// address, timeouts, limits, retries, upstream, breaker, health, log) are
// reported, not applied.
func (r *router) reload(cfg fileConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.state.Load()
	applyKeys, err := prepareKeys(r.srv, cfg)
	if err != nil {
		return err
	}
	st, err := r.buildFleet(cfg, old)
	if err != nil {
		return err
	}
	if err := r.srv.SetRoutes(st.routes()); err != nil {
		return err
	}
	r.state.Store(st)
	applyKeys()
	r.startLoopsLocked(st, old)
	if fixed := restartOnly(old.cfg, cfg); len(fixed) > 0 {
		r.log.Warn("configuration reloaded; these options take effect only at restart", zap.Strings("options", fixed))
	} else {
		r.log.Info("configuration reloaded", zap.Int("pools", len(st.pools)), zap.Int("replicas", len(st.replicas)))
	}
	return nil
}

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
	} {
		if !reflect.DeepEqual(f.a, f.b) {
			out = append(out, f.name)
		}
	}
	return out
}

// startLoopsLocked starts the controllers and poller of st that aren't
// running, and stops those of prev that st dropped. Before run, it does
// nothing: run starts the current state's loops.
func (r *router) startLoopsLocked(st, prev *fleetState) {
	if r.bg == nil {
		return
	}
	keep := map[*admission.Controller]bool{}
	for _, ctl := range st.adm {
		keep[ctl] = true
		if _, running := r.ctlCancel[ctl]; running {
			continue
		}
		ctx, cancel := context.WithCancel(r.bg)
		r.ctlCancel[ctl] = cancel
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			ctl.Run(ctx) //nolint:errcheck
		}()
	}
	for ctl, cancel := range r.ctlCancel {
		if !keep[ctl] {
			cancel()
			delete(r.ctlCancel, ctl)
		}
	}
	if prev == nil || st.poller != prev.poller {
		if r.pollStop != nil {
			r.pollStop()
			r.pollStop = nil
		}
		if st.poller != nil {
			ctx, cancel := context.WithCancel(r.bg)
			r.pollStop = cancel
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				st.poller.Run(ctx) //nolint:errcheck
			}()
		}
	}
}

// run serves until ctx ends, then drains for up to drain.
func (r *router) run(ctx context.Context, ln net.Listener, drain time.Duration) error {
	bg, cancelBG := context.WithCancel(context.Background())
	r.mu.Lock()
	r.bg = bg
	r.startLoopsLocked(r.state.Load(), nil)
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.health.Run(bg) //nolint:errcheck
	}()
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
	cancelBG()
	r.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// pollerCollector exposes the current poller's metrics; the poller is
// replaced on reload while the registry keeps this one collector.
type pollerCollector struct{ r *router }

func (c pollerCollector) Describe(chan<- *prometheus.Desc) {} // unchecked: the set follows the poller

func (c pollerCollector) Collect(ch chan<- prometheus.Metric) {
	if st := c.r.state.Load(); st != nil && st.poller != nil {
		st.poller.Collector().Collect(ch)
	}
}
