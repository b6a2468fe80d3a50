package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/proxy/observe"
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
	fs.Var(&pools, "pool", "MODEL=URL[,URL...] or MODEL=dns://NAME:PORT (every address NAME resolves to, re-resolved every 5s): a pool for the flag-only quick start (repeatable)")
	policy := fs.String("policy", "", "policy of the --pool pools: "+strings.Join(balancer.Policies(), ", "))
	admissionFlag := fs.String("admission", "", "on|off: length-aware admission (queue at the router while pools are saturated); overrides the file (default on)")
	adminListen := fs.String("admin-listen", "", "admin API address (e.g. 127.0.0.1:8081); overrides the file's admin.listen")
	adminToken := fs.String("admin-token", "", "bearer token the admin API requires; overrides the file's admin.token")
	var apiKeys stringList
	fs.Var(&apiKeys, "api-key", "KEY: a client API key (at least 16 characters), for every model, without limits (repeatable; enables client auth; only its SHA-256 is kept)")
	hashKey := fs.String("hash-key", "", "print the hash of API key KEY (\"-\" reads it from stdin) for auth.keys or a keys file, and exit")
	migrationLimit := -1 // not given: each pool's migration.max
	fs.Func("migration-limit", "N: how many times one stream may continue on another replica when its own dies mid-stream, for every pool (0 = off); overrides the file's pools[].migration.max (default 1)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a whole number >= 0, got %q", v)
		}
		migrationLimit = n
		return nil
	})
	requestLoops := -1 // not given: the file's upstream.request_loops and goroutine_requests
	fs.Func("request-loops", "N: request loops serving API requests, streams' events included, Linux; 0 serves every request on fasthttp's goroutines (upstream.goroutine_requests); overrides the file (default: one per two of GOMAXPROCS)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a whole number >= 0, got %q", v)
		}
		requestLoops = n
		return nil
	})
	cpuProfile := fs.String("cpu-profile", "", "FILE: write a CPU profile (pprof) of the router from its start to its shutdown to FILE, e.g. to renew cmd/gpurouter/default.pgo")
	printConfig := fs.Bool("print-config", false, "print the effective configuration (YAML, defaults filled) and exit")
	check := fs.Bool("check", false, "validate the configuration and exit (non-zero listing every error)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "serve: unexpected arguments: %v\n", fs.Args())
		return 2
	}
	if *hashKey != "" {
		return printKeyHash(*hashKey, os.Stdin, stdout, stderr)
	}
	if err := checkFlagKeys(apiKeys); err != nil {
		fmt.Fprintf(stderr, "serve: %v\n", err)
		return 2
	}

	if *configPath != "" && len(pools) > 0 {
		fmt.Fprintln(stderr, "serve: give either --config or --pool, not both")
		return 2
	}
	if *configPath == "" && len(pools) == 0 {
		fmt.Fprintln(stderr, "serve: need --config FILE, or --pool MODEL=URL[,URL...] (e.g. gpurouter serve --listen 127.0.0.1:8080 --pool m=http://127.0.0.1:9001)")
		return 2
	}
	// load reads the effective configuration: the file (or the --pool
	// flags) with the command line's overrides. Reloads call it again.
	load := func() (fileConfig, error) {
		var cfg fileConfig
		var err error
		if *configPath != "" {
			cfg, err = loadConfigFile(*configPath)
		} else {
			cfg, err = configFromFlags(*listen, pools, *policy)
		}
		if err != nil {
			return cfg, err
		}
		if *listen != "" {
			cfg.Listen = *listen
		}
		switch *admissionFlag {
		case "":
		case "on":
			cfg.Admission.Disabled = false
		case "off":
			cfg.Admission.Disabled = true
		default:
			return cfg, fmt.Errorf("--admission %q: want on or off", *admissionFlag)
		}
		if *adminListen != "" {
			cfg.Admin.Listen = *adminListen
		}
		if *adminToken != "" {
			cfg.Admin.Token = *adminToken
		}
		if requestLoops >= 0 {
			cfg.Upstream.RequestLoops, cfg.Upstream.GoroutineRequests = requestLoops, requestLoops == 0
		}
		if migrationLimit >= 0 {
			for i := range cfg.Pools {
				n := migrationLimit
				cfg.Pools[i].Migration.Max = &n
			}
		}
		cfg.Auth.Keys = append(cfg.Auth.Keys, flagKeys(apiKeys)...)
		if err := validate(cfg); err != nil {
			return cfg, err
		}
		_, _, err = clientKeys(cfg) // the keys file, so that --check and reloads see its problems
		return cfg, err
	}
	cfg, err := load()
	if err != nil {
		fmt.Fprintf(stderr, "serve: %v\n", err)
		return 1
	}
	if *check {
		fmt.Fprintln(stdout, "configuration OK")
		return 0
	}
	if *printConfig {
		if err := writeConfigYAML(stdout, redacted(cfg)); err != nil {
			fmt.Fprintf(stderr, "serve: %v\n", err)
			return 1
		}
		return 0
	}

	// The log is buffered (logbuf.go): the deferred Sync writes what the
	// drain logged after the flush loop stopped.
	log, logBuf, err := newBufferedLogger(cfg.Log, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "serve: %v\n", err)
		return 1
	}
	defer log.Sync() //nolint:errcheck

	if *cpuProfile != "" {
		stopProfile, err := startCPUProfile(*cpuProfile)
		if err != nil {
			log.Error("serve", zap.Error(err))
			return 1
		}
		defer func() {
			if err := stopProfile(); err != nil {
				log.Error("cpu profile", zap.Error(err))
			}
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		log.Error("listen", zap.Error(err))
		return 1
	}
	r, err := newRouterWith(cfg, log, routerDeps{access: cfg.Log.accessLog(logBuf)})
	if err != nil {
		ln.Close()
		log.Error("configuration", zap.Error(err))
		return 1
	}
	// What SIGHUP and POST /admin/reload run: the file is read as part of
	// the fleet change, so it is applied as it is when the reload takes
	// effect.
	reload := func() error { return r.reloadFrom(load) }
	side := []runner{logBuf}
	if cfg.Admin.Listen != "" {
		adminLn, err := net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			ln.Close()
			log.Error("admin listen", zap.Error(err))
			return 1
		}
		side = append(side, r.admin(adminLn, cfg.Admin.Token, reload))
		log.Info("admin API", zap.String("listen", adminLn.Addr().String()))
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	side = append(side, hupReloader{hup: hup, reload: reload, log: log})
	log.Info("gpurouter serving", zap.String("listen", ln.Addr().String()), zap.Int("pools", len(cfg.Pools)))
	if err := r.run(ctx, ln, cfg.Shutdown.DrainTimeout, side...); err != nil {
		log.Error("serve", zap.Error(err))
		return 1
	}
	return 0
}

// accessLog is w when the log is JSON at info level or below: then the
// proxy writes its common access log lines to w itself, the bytes zap
// would write (proxy.Options.AccessLog). nil otherwise (a console log, or
// a level that leaves the access log out).
func (lc logConfig) accessLog(w io.Writer) io.Writer {
	level, err := zapcore.ParseLevel(lc.Level)
	if err != nil || lc.Format == "console" || !level.Enabled(zapcore.InfoLevel) {
		return nil
	}
	return w
}

func newLogger(lc logConfig, w io.Writer) (*zap.Logger, error) {
	return newLoggerSync(lc, zapcore.Lock(zapcore.AddSync(w)))
}

// newLoggerSync is newLogger writing to ws, which must be safe for
// concurrent use.
func newLoggerSync(lc logConfig, ws zapcore.WriteSyncer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(lc.Level)
	if err != nil {
		return nil, err
	}
	// The proxy writes its common access log lines in this JSON itself
	// (accessLog): the configuration is the proxy's.
	encCfg := observe.LogEncoderConfig()
	var enc zapcore.Encoder
	if lc.Format == "console" {
		enc = zapcore.NewConsoleEncoder(encCfg)
	} else {
		enc = zapcore.NewJSONEncoder(encCfg)
	}
	return zap.New(zapcore.NewCore(enc, ws, level)), nil
}
