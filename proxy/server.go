// Package proxy is gpurouter's data plane: the fasthttp server that accepts
// OpenAI-compatible requests, parses each body once, asks the balancer for a
// replica, forwards with bounded retries before the first byte, relays SSE
// streams event by event, maps every error to one OpenAI error shape, and
// measures every request (TTFT, ITL, TPOT, e2e, queue time).
//
// Start reading at handler.go: it follows one request top to bottom.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Options are a Server's dependencies. Zero fields take the defaults noted.
type Options struct {
	Config Config
	Pools  []*balancer.Pool // at least one; model names and aliases must be unique
	// Admission, per pool, queues requests while the pool is saturated;
	// pools without an entry admit everything.
	Admission map[*balancer.Pool]PoolAdmission
	// Score is how the pools' load policies weigh work; the proxy uses it
	// to lease requests with their cost (prompt weighted by PrefillWeight).
	Score balancer.ScoreConfig
	// Keys turns client authentication on: every API request needs one of
	// its API keys (see clients.go). nil means no authentication.
	Keys *KeyStore
	// MaxTokens caps, per pool model, the output a request may ask for:
	// max_tokens / max_completion_tokens above the cap (or absent) are
	// rewritten to it. Models not listed, or 0, have no cap.
	MaxTokens map[string]int

	// Registerer receives the router's metrics; Gatherer serves /metrics.
	// Both nil means a fresh private registry.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer

	Logger *zap.Logger           // nil means no logging
	Now    func() time.Time      // nil means time.Now
	Jitter func(n int64) int64   // uniform in [0,n); nil means math/rand/v2
	IDs    func() string         // request id generator; nil means a per-process prefix and a counter
	Sleep  func(d time.Duration) // retry backoff; nil means time.Sleep

	// AfterFunc arms the timers that watch a response in progress for a
	// vanished client (see watch.go); nil means time.AfterFunc.
	AfterFunc func(d time.Duration, f func()) Timer
}

// Server is the router's HTTP front end. Build with New, run with Serve,
// stop with Shutdown.
type Server struct {
	cfg     Config
	score   balancer.ScoreConfig
	log     *zap.Logger
	m       *metrics
	gather  prometheus.Gatherer
	routes  atomic.Pointer[routeTable]
	keys    atomic.Pointer[KeyStore] // nil: no client authentication
	maxToks atomic.Pointer[map[string]int]
	authM   *authMetrics
	records *recordRing
	srv     *fasthttp.Server

	now    func() time.Time
	jitter func(int64) int64
	ids    func() string
	sleep  func(time.Duration)

	afterFunc func(time.Duration, func()) Timer // nil means time.AfterFunc

	seq          atomic.Uint64 // numbers every request sent upstream (X-Gpurouter-Seq)
	active       atomic.Int64  // exchanges not yet finished
	draining     atomic.Bool   // shutdown began: /ready fails, new requests get 503
	abortStreams atomic.Bool   // drain deadline passed: streams in progress are ended
}

// New builds a Server. It starts nothing.
func New(o Options) (*Server, error) {
	if len(o.Pools) == 0 {
		return nil, errors.New("proxy: no pools")
	}
	s := &Server{
		cfg:    o.Config.withDefaults(),
		score:  o.Score,
		log:    o.Logger,
		now:    o.Now,
		jitter: o.Jitter,
		ids:    o.IDs,
		sleep:  o.Sleep,
	}
	s.afterFunc = o.AfterFunc
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.jitter == nil {
		s.jitter = rand.Int64N
	}
	if s.sleep == nil {
		s.sleep = time.Sleep
	}
	if s.ids == nil {
		s.ids = sequentialIDs(s.jitter)
	}
	reg, gather := o.Registerer, o.Gatherer
	if reg == nil && gather == nil {
		r := prometheus.NewRegistry()
		reg, gather = r, r
	}
	if reg == nil || gather == nil {
		return nil, errors.New("proxy: Registerer and Gatherer must be given together")
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("proxy: metrics: %w", err)
	}
	if err := reg.Register(balancer.NewCollector(s.Pools)); err != nil {
		return nil, fmt.Errorf("proxy: metrics: %w", err)
	}
	s.m, s.gather = m, gather
	if s.authM, err = newAuthMetrics(reg); err != nil {
		return nil, fmt.Errorf("proxy: metrics: %w", err)
	}
	s.keys.Store(o.Keys)
	s.SetMaxTokens(o.MaxTokens)
	s.records = newRecordRing(s.cfg.RecordRing)
	rt, err := buildRoutes(o.Pools, o.Admission, s.cfg, m, s.now, nil)
	if err != nil {
		return nil, err
	}
	s.routes.Store(rt)
	s.srv = &fasthttp.Server{
		Handler:            s.handle,
		ErrorHandler:       s.handleParseError,
		Name:               "gpurouter",
		MaxRequestBodySize: s.cfg.MaxBodyBytes,
		ReadBufferSize:     s.cfg.MaxHeaderBytes, // bounds the request line + headers: more is a 431 (handleParseError)
		ReadTimeout:        s.cfg.ReadTimeout,    // a client must send its request within this (slowloris)
		Concurrency:        s.cfg.MaxConnections, // connections over it get fasthttp's 503 and are closed
		IdleTimeout:        2 * time.Minute,
		// WriteTimeout stays 0: it would cap whole streams.
		NoDefaultServerHeader:         true,
		DisableHeaderNamesNormalizing: true,
		CloseOnShutdown:               true,
		ReduceMemoryUsage:             false,
		// Parse errors must not quote the request: its headers may hold
		// an API key.
		SecureErrorLogMessage: true,
		// fasthttp logs every connection that ends in an error; a client
		// that hangs up is routine here (and already in the access log).
		Logger: fasthttpLogger{s.log},
	}
	return s, nil
}

// Pools returns the pools currently served.
func (s *Server) Pools() []*balancer.Pool { return s.routes.Load().pools }

// Handler is the router's request handler, for callers that run their own
// fasthttp.Server (tests, embedding).
func (s *Server) Handler() fasthttp.RequestHandler { return s.handle }

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.srv.Serve(ln) }

// Shutdown stops accepting, lets requests in progress finish until ctx
// ends, then ends the streams still running (their clients get an error
// event and [DONE]) and waits briefly for them to close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	err := s.srv.ShutdownWithContext(ctx)
	if err == nil {
		return nil
	}
	s.abortStreams.Store(true)
	grace, cancel := context.WithTimeout(context.Background(), 2*time.Second+2*s.cfg.DisconnectCheck)
	defer cancel()
	if err2 := s.srv.ShutdownWithContext(grace); err2 != nil {
		return fmt.Errorf("proxy: shutdown: %d requests still open: %w", s.active.Load(), err2)
	}
	return nil
}

// SetPools replaces the pools the router serves, atomically: requests
// already routed keep their replica and upstream connection until they
// end; new requests see only the new pools. Replicas carried over (the same
// *balancer.Replica) keep their upstream client and connections.
func (s *Server) SetPools(pools []*balancer.Pool, adm map[*balancer.Pool]PoolAdmission) error {
	if len(pools) == 0 {
		return errors.New("proxy: no pools")
	}
	rt, err := buildRoutes(pools, adm, s.cfg, s.m, s.now, s.routes.Load())
	if err != nil {
		return err
	}
	s.routes.Store(rt)
	return nil
}

// SetMaxTokens replaces the per-model output caps (see Options.MaxTokens);
// requests already forwarded keep theirs.
func (s *Server) SetMaxTokens(caps map[string]int) {
	m := make(map[string]int, len(caps))
	for model, n := range caps {
		if n > 0 {
			m[model] = n
		}
	}
	s.maxToks.Store(&m)
}

// maxTokensOf is the output cap of pool p's requests, 0 for none.
func (s *Server) maxTokensOf(p *balancer.Pool) int { return (*s.maxToks.Load())[p.Model()] }

// Active is the number of requests in progress.
func (s *Server) Active() int64 { return s.active.Load() }

func (s *Server) totalExceeded(x *exchange) bool {
	return s.cfg.TotalTimeout > 0 && s.now().Sub(x.received) > s.cfg.TotalTimeout
}

// sequentialIDs makes request ids unique across processes (random prefix)
// and cheap within one (a counter).
func sequentialIDs(jitter func(int64) int64) func() string {
	prefix := "gr-" + strconv.FormatInt(jitter(1<<40), 36) + "-"
	var n atomic.Uint64
	return func() string { return prefix + strconv.FormatUint(n.Add(1), 36) }
}

// fasthttpLogger sends fasthttp's own messages to zap at debug level.
type fasthttpLogger struct{ log *zap.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	if ce := l.log.Check(zap.DebugLevel, "fasthttp"); ce != nil {
		ce.Write(zap.String("message", fmt.Sprintf(format, args...)))
	}
}

// routeTable is the immutable map from requests to pools and replicas to
// upstream clients, swapped whole when the configuration changes.
type routeTable struct {
	pools     []*balancer.Pool
	byModel   map[string]*balancer.Pool // model names and aliases
	prefixes  []prefixRoute             // longest first
	upstreams map[*balancer.Replica]*upstream
	admit     map[*balancer.Pool]PoolAdmission // pools with admission control
	models    []byte                           // the /v1/models document
}

// upstream looks up a replica's upstream; a nil table has none.
func (rt *routeTable) upstream(r *balancer.Replica) (*upstream, bool) {
	if rt == nil {
		return nil, false
	}
	u, ok := rt.upstreams[r]
	return u, ok
}

type prefixRoute struct {
	prefix string
	pool   *balancer.Pool
}

func buildRoutes(pools []*balancer.Pool, adm map[*balancer.Pool]PoolAdmission, cfg Config, m *metrics, now func() time.Time, prev *routeTable) (*routeTable, error) {
	rt := &routeTable{
		admit:     adm,
		pools:     pools,
		byModel:   make(map[string]*balancer.Pool),
		upstreams: make(map[*balancer.Replica]*upstream),
	}
	var names []string
	for _, p := range pools {
		for _, name := range append([]string{p.Model()}, p.Aliases()...) {
			if _, dup := rt.byModel[name]; dup {
				return nil, fmt.Errorf("proxy: model name %q used by two pools", name)
			}
			rt.byModel[name] = p
			names = append(names, name)
		}
		if pp := strings.TrimRight(p.PathPrefix(), "/"); pp != "" {
			rt.prefixes = append(rt.prefixes, prefixRoute{prefix: pp, pool: p})
		}
		for _, r := range p.Replicas() {
			if u, ok := prev.upstream(r); ok && u.pool == p {
				rt.upstreams[r] = u
				continue
			}
			rt.upstreams[r] = newUpstream(p, r, cfg, m)
		}
	}
	sort.Slice(rt.prefixes, func(i, j int) bool { return len(rt.prefixes[i].prefix) > len(rt.prefixes[j].prefix) })
	rt.models = modelsJSON(names, now())
	return rt, nil
}
