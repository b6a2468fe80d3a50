package gpu

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// AgentConfig configures the HTTP face of `gpurouter agent`.
type AgentConfig struct {
	// Source is the host's GPUs, usually NewNVMLSource(session, Selector{}).
	// Required.
	Source Source
	// Host is the name reported in HostReport.Host; "" means os.Hostname().
	Host string
	// Now stamps HostReport.At; nil means time.Now.
	Now func() time.Time
	// Timeout bounds one read of Source per HTTP request (default 2s).
	Timeout time.Duration
	// Registry is what GET /metrics serves; the agent registers its GPU
	// collector in it. nil means a private registry holding only that
	// collector.
	Registry *prometheus.Registry
	// Log receives read failures (once per change between failing and
	// not); nil means no logging.
	Log *zap.Logger
}

// DefaultAgentTimeout is AgentConfig.Timeout's default.
const DefaultAgentTimeout = 2 * time.Second

// Agent serves one host's GPU stats for routers on other hosts:
//
//	GET /v1/gpus   HostReport as JSON (an empty gpus list when telemetry is off)
//	GET /metrics   Prometheus text: gpurouter_gpu_* series labelled uuid, index
//
// Build with NewAgent; the zero value is unusable. Agent is an http.Handler.
type Agent struct {
	src     Source
	host    string
	now     func() time.Time
	timeout time.Duration
	log     *zap.Logger
	metrics http.Handler
	mux     *http.ServeMux
	status  *readStatus
}

// NewAgent validates cfg, registers the GPU collector and returns the
// handler. It starts nothing and does not read the Source.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	if cfg.Source == nil {
		return nil, errors.New("gpu: AgentConfig.Source is required")
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultAgentTimeout
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	a := &Agent{src: cfg.Source, host: cfg.Host, now: cfg.Now, timeout: cfg.Timeout, log: cfg.Log,
		status: &readStatus{}}
	if err := cfg.Registry.Register(newGPUCollector(a.read)); err != nil {
		return nil, err
	}
	a.metrics = promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{ErrorLog: zap.NewStdLog(cfg.Log)})
	a.mux = http.NewServeMux()
	a.mux.HandleFunc("GET /v1/gpus", a.serveGPUs)
	a.mux.Handle("GET /metrics", a.metrics)
	a.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return a, nil
}

func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// Report reads the Source into a HostReport. Telemetry off is not an
// error: the report then lists no GPUs.
func (a *Agent) Report(ctx context.Context) (HostReport, error) {
	gpus, _, err := a.read(ctx)
	if gpus == nil {
		gpus = []GPUStats{} // JSON [] rather than null
	}
	return HostReport{Host: a.host, At: a.now(), GPUs: gpus}, err
}

// read is one bounded read of the Source; on is false (and err nil) when
// GPU telemetry is off.
func (a *Agent) read(ctx context.Context) (gpus []GPUStats, on bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	gpus, err = a.src.Fetch(ctx)
	if errors.Is(err, ErrGPUOff) {
		return nil, false, nil
	}
	a.status.observe(a.log, err)
	return gpus, true, err
}

func (a *Agent) serveGPUs(w http.ResponseWriter, r *http.Request) {
	rep, err := a.Report(r.Context())
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(map[string]string{"error": err.Error()}) //nolint:errcheck // client gone
		return
	}
	json.NewEncoder(w).Encode(rep) //nolint:errcheck // client gone
}

// readStatus turns a stream of read outcomes into log lines on change only:
// one when reads start failing, one when they recover.
type readStatus struct {
	mu       sync.Mutex // guards the fields below
	failing  bool
	failures int
}

func (s *readStatus) observe(log *zap.Logger, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil && !s.failing:
		s.failing, s.failures = true, 1
		log.Warn("GPU read failing", zap.Error(err))
	case err != nil:
		s.failures++
	case s.failing:
		log.Info("GPU read recovered", zap.Int("failed_reads", s.failures))
		s.failing, s.failures = false, 0
	}
}

// Serve answers on ln until ctx is done, then stops accepting, lets requests
// in flight finish (up to DefaultAgentTimeout more) and returns nil; it
// returns the listener's error if serving fails first. ln is closed.
func (a *Agent) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           a,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          zap.NewStdLog(a.log),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), DefaultAgentTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
