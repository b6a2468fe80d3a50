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
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func runServe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "YAML configuration file (see configs/gpurouter.example.yaml)")
	listen := fs.String("listen", "", "listen address for the flag-only quick start (default 0.0.0.0:8080); overrides the file's listen")
	var pools stringList
	fs.Var(&pools, "pool", "MODEL=URL[,URL...]: a pool for the flag-only quick start (repeatable)")
	policy := fs.String("policy", "", "policy of the --pool pools: "+strings.Join(balancer.Policies(), ", "))
	admissionFlag := fs.String("admission", "", "on|off: length-aware admission (queue at the router while pools are saturated); overrides the file (default on)")
	printConfig := fs.Bool("print-config", false, "print the effective configuration (YAML, defaults filled) and exit")
	check := fs.Bool("check", false, "validate the configuration and exit (non-zero listing every error)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "serve: unexpected arguments: %v\n", fs.Args())
		return 2
	}

	var cfg fileConfig
	var err error
	switch {
	case *configPath != "" && len(pools) > 0:
		fmt.Fprintln(stderr, "serve: give either --config or --pool, not both")
		return 2
	case *configPath != "":
		cfg, err = loadConfigFile(*configPath)
		if err == nil && *listen != "" {
			cfg.Listen = *listen
			err = validate(cfg)
		}
	case len(pools) > 0:
		cfg, err = configFromFlags(*listen, pools, *policy)
	default:
		fmt.Fprintln(stderr, "serve: need --config FILE, or --pool MODEL=URL[,URL...] (e.g. gpurouter serve --listen 127.0.0.1:8080 --pool m=http://127.0.0.1:9001)")
		return 2
	}
	if err == nil && *admissionFlag != "" {
		switch *admissionFlag {
		case "on":
			cfg.Admission.Disabled = false
		case "off":
			cfg.Admission.Disabled = true
		default:
			err = fmt.Errorf("--admission %q: want on or off", *admissionFlag)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "serve: %v\n", err)
		return 1
	}
	if *check {
		fmt.Fprintln(stdout, "configuration OK")
		return 0
	}
	if *printConfig {
		if err := writeConfigYAML(stdout, cfg); err != nil {
			fmt.Fprintf(stderr, "serve: %v\n", err)
			return 1
		}
		return 0
	}

	log, err := newLogger(cfg.Log, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "serve: %v\n", err)
		return 1
	}
	defer log.Sync() //nolint:errcheck

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		log.Error("listen", zap.Error(err))
		return 1
	}
	r, err := newRouter(cfg, log)
	if err != nil {
		ln.Close()
		log.Error("configuration", zap.Error(err))
		return 1
	}
	log.Info("gpurouter serving", zap.String("listen", ln.Addr().String()), zap.Int("pools", len(cfg.Pools)))
	if err := r.run(ctx, ln, cfg.Shutdown.DrainTimeout); err != nil {
		log.Error("serve", zap.Error(err))
		return 1
	}
	return 0
}

// router is a configured proxy and its background loops.
type router struct {
	srv       *proxy.Server
	health    *balancer.HealthChecker
	poller    *gpu.Poller // nil when telemetry is disabled
	admission map[*balancer.Pool]proxy.PoolAdmission
	log       *zap.Logger
}

// newRouter translates the file schema into the packages' configs.
func newRouter(cfg fileConfig, log *zap.Logger) (*router, error) {
	bc := balancer.BreakerConfig{
		ConsecutiveFailures: cfg.Breaker.ConsecutiveFailures,
		OpenTimeout:         cfg.Breaker.OpenTimeout,
		HalfOpenRequests:    cfg.Breaker.HalfOpenRequests,
	}
	var pools []*balancer.Pool
	var all []*balancer.Replica
	byPool := make([][]*balancer.Replica, len(cfg.Pools))
	score := scoreConfig(cfg)
	for i, pc := range cfg.Pools {
		var reps []*balancer.Replica
		for j, rc := range pc.Replicas {
			r, err := balancer.NewReplica(balancer.ReplicaConfig{Name: rc.Name, URL: rc.URL, Weight: rc.Weight}, bc, nil)
			if err != nil {
				return nil, fmt.Errorf("pools[%d].replicas[%d]: %w", i, j, err)
			}
			reps = append(reps, r)
		}
		p, err := balancer.NewPool(balancer.PoolConfig{
			Model: pc.Model, Aliases: pc.Aliases, PathPrefix: pc.PathPrefix, Policy: pc.Policy,
			Arms: arms(pc), Picker: balancer.PickerOptions{Score: score},
		}, reps)
		if err != nil {
			return nil, fmt.Errorf("pools[%d]: %w", i, err)
		}
		pools = append(pools, p)
		all = append(all, reps...)
		byPool[i] = reps
	}
	reg := prometheus.NewRegistry()
	adm, err := newAdmission(cfg, pools, reg)
	if err != nil {
		return nil, err
	}
	poller, err := newPoller(cfg, pools, byPool, adm, log)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if poller != nil {
		reg.MustRegister(poller.Collector())
	}
	srv, err := proxy.New(proxy.Options{
		Config: proxy.Config{
			ConnectTimeout:     cfg.Timeouts.Connect,
			FirstByteTimeout:   cfg.Timeouts.FirstByte,
			IdleTimeout:        cfg.Timeouts.Idle,
			TotalTimeout:       cfg.Timeouts.Total,
			MaxBodyBytes:       cfg.Limits.MaxBodyBytes,
			MaxAttempts:        cfg.Retry.MaxAttempts,
			BackoffBase:        cfg.Retry.BackoffBase,
			BackoffMax:         cfg.Retry.BackoffMax,
			MaxConnsPerReplica: cfg.Upstream.MaxConnsPerReplica,
			MaxIdleConnTime:    cfg.Upstream.MaxIdleConnTime,
		},
		Pools:      pools,
		Score:      score,
		Admission:  adm,
		Registerer: reg,
		Gatherer:   reg,
		Logger:     log,
	})
	if err != nil {
		return nil, err
	}
	health := balancer.NewHealthChecker(balancer.HealthConfig{
		Interval:           cfg.Health.Interval,
		Timeout:            cfg.Health.Timeout,
		UnhealthyThreshold: cfg.Health.UnhealthyThreshold,
		HealthyThreshold:   cfg.Health.HealthyThreshold,
	}, balancer.HTTPProber{Path: cfg.Health.Path}, func() []*balancer.Replica { return all }, log)
	return &router{srv: srv, health: health, poller: poller, admission: adm, log: log}, nil
}

// run serves until ctx ends, then drains for up to drain.
func (r *router) run(ctx context.Context, ln net.Listener, drain time.Duration) error {
	bg, cancelBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.health.Run(bg) //nolint:errcheck
	}()
	for _, pa := range r.admission {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pa.Controller.Run(bg) //nolint:errcheck
		}()
	}
	if r.poller != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.poller.Run(bg) //nolint:errcheck
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
	cancelBG()
	wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func newLogger(lc logConfig, w io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(lc.Level)
	if err != nil {
		return nil, err
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if lc.Format == "console" {
		enc = zapcore.NewConsoleEncoder(encCfg)
	} else {
		enc = zapcore.NewJSONEncoder(encCfg)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), level)), nil
}
