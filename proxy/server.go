// Package proxy is gpurouter's data plane: the fasthttp server that accepts
// OpenAI-compatible requests, parses each body once, asks the balancer for a
// replica, forwards with bounded retries before the first byte, relays SSE
// streams event by event, maps every error to one OpenAI error shape, and
// measures every request (TTFT, ITL, TPOT, e2e, queue time).
//
// Start reading at flow.go: it follows one request top to bottom, on
// either path (handler.go: fasthttp's goroutines; reqloop_*_linux.go: the
// request loops).
package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/proxy/auth"
	"github.com/gpurouter/gpurouter/proxy/observe"
	"github.com/gpurouter/gpurouter/tracing"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
	"go.uber.org/zap"
)

// Options are a Server's dependencies. Zero fields take the defaults noted.
type Options struct {
	Config Config
	// Routes are the pools served, each with its admission and output cap:
	// at least one; model names and aliases must be unique. SetRoutes
	// replaces them while serving.
	Routes []Route
	// Score is how the pools' load policies weigh work; the proxy uses it
	// to lease requests with their cost (prompt weighted by PrefillWeight).
	Score balancer.ScoreConfig
	// Keys turns client authentication on: every API request needs one of
	// its API keys (see clients.go). nil means no authentication.
	Keys *auth.KeyStore
	// StatusToken guards the status page (/status and /): when set, the
	// page needs it as "Authorization: Bearer TOKEN" or, for a browser,
	// ?token=TOKEN. cmd/gpurouter sets it to the admin token. "" leaves the
	// page open, as /metrics is.
	StatusToken string
	// Tracer records each API request's spans and carries its trace
	// context to the engines (trace.go). nil, or one that is off, traces
	// nothing, costs nothing and passes a client's traceparent to the
	// engine untouched. The caller shuts it down after Shutdown.
	Tracer *tracing.Tracer

	// Registerer receives the router's metrics; Gatherer serves /metrics.
	// Both nil means a fresh private registry.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer

	Logger *zap.Logger // nil means no logging
	// AccessLog, when set, takes the access log's common lines — an
	// exchange with no error to report and no migration — straight from
	// the router, in the bytes Logger would write with zap's JSON encoder
	// and LogEncoderConfig (`gpurouter serve`'s log), at a fraction of
	// zap's cost (accesslog.go). Set it only to the writer such a Logger
	// writes its info lines to; the other lines still go through Logger.
	// It must be safe for concurrent use. nil: every line goes through
	// Logger.
	AccessLog io.Writer

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
	cfg    Config
	to     timeouts // the time limits, one table (timeouts.go)
	score  balancer.ScoreConfig
	log    *zap.Logger
	m      *metrics
	gather prometheus.Gatherer
	routes atomic.Pointer[routeTable]
	keys   atomic.Pointer[auth.KeyStore] // nil: no client authentication
	// statusToken guards the status page; "" means open.
	statusToken string
	tracer      *tracing.Tracer // nil or off: no tracing
	// plainEst costs the requests of pools without admission: it never
	// learns, so its estimates keep their defaults.
	plainEst *admission.Estimator
	authM    *authMetrics
	parsers  fastjson.ParserPool // JSON bodies' parsers: requests (openai.ReadRequest), whole responses (wholeUsage)
	records  *observe.Records
	lat      *observe.Latency // ITL and queue-time sketches per replica (latency.go)
	srv      *fasthttp.Server
	pumps    []*streamPump  // the stream loops, run by Serve (pump_linux.go)
	nextPump atomic.Uint64  // the loop the last stream went to
	reqLoops []*requestLoop // the request loops, run by Serve (reqloop_linux.go)
	door     *frontDoor     // the request grammar in front of fasthttp's reads (frontdoor.go)
	nextLoop atomic.Uint64  // the request loop the last connection went to
	batchLog sync.Once      // batchOff's

	// flows pools the goroutine path's request flows (proxyAPI).
	flows sync.Pool
	// loads is the router's LoRA adapter loads (lora_load.go).
	loads *adapterLoads
	// accessFields pools the access log line's fields (*accessFields,
	// exchange.finish); access writes the common lines without them.
	accessFields sync.Pool
	access       observe.AccessLog

	now    func() time.Time
	jitter func(int64) int64
	ids    func() string
	sleep  func(time.Duration)

	afterFunc func(time.Duration, func()) Timer // nil means time.AfterFunc

	// base is the context every request's waits derive from; Shutdown
	// cancels it (cause ErrShuttingDown) when the drain deadline passes.
	base     context.Context
	stopBase context.CancelCauseFunc

	seq          atomic.Uint64 // numbers every request sent upstream (X-Gpurouter-Seq)
	active       atomic.Int64  // exchanges not yet finished
	streams      atomic.Int64  // streams relayed on a hijacked connection, which fasthttp no longer counts (hijack.go)
	kept         keptConns     // connections handed back to fasthttp after a stream (hijack.go)
	conns        atomic.Int64  // client connections open, held to MaxConnections (prefetch.go)
	draining     atomic.Bool   // shutdown began: /ready fails, new requests get 503
	abortStreams atomic.Bool   // drain deadline passed: streams in progress are ended
	// The listeners Serve was given, which Shutdown closes itself:
	// fasthttp's closes only those its Serve has registered, and a
	// Shutdown just before that (a SIGTERM as the router starts) would
	// leave Serve accepting for good.
	lnMu sync.Mutex
	lns  []*onceListener
}

// New builds a Server. It starts nothing.
func New(o Options) (*Server, error) {
	if len(o.Routes) == 0 {
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
	s.to = newTimeouts(s.cfg)
	s.flows.New = func() any { return new(flow) }
	s.accessFields.New = func() any { return new(accessFields) }
	s.access.W = o.AccessLog
	s.statusToken = o.StatusToken
	s.tracer = o.Tracer
	s.base, s.stopBase = context.WithCancelCause(context.Background())
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
	s.loads = newAdapterLoads(newLoRAClient(s.cfg), s.now, m.loraLoads)
	if s.authM, err = newAuthMetrics(reg); err != nil {
		return nil, fmt.Errorf("proxy: metrics: %w", err)
	}
	s.keys.Store(o.Keys)
	s.records = observe.NewRecords(s.cfg.RecordRing)
	s.lat = observe.NewLatency()
	s.plainEst = admission.NewEstimator(admission.EstimateConfig{})
	for range s.cfg.StreamLoops {
		s.pumps = append(s.pumps, newStreamPump(s.cfg, s.m, o.Now, s.batchOff))
	}
	for i := 0; haveRequestLoops && !s.cfg.GoroutineRequests && i < s.cfg.RequestLoops; i++ {
		s.reqLoops = append(s.reqLoops, newRequestLoop(s, o.Now))
	}
	for _, p := range s.pumps {
		// A request loop relaying streams keeps its P too: a stream loop
		// keeps one only while the two kinds together leave a P free.
		p.loops += len(s.reqLoops)
	}
	if err := registerLoopGauges(reg, s.pumps, s.reqLoops); err != nil {
		return nil, fmt.Errorf("proxy: metrics: %w", err)
	}
	if err := s.SetRoutes(o.Routes); err != nil {
		return nil, err
	}
	s.door = newFrontDoor(s.cfg, serverName, s.m.refused)
	s.srv = &fasthttp.Server{
		Handler:            s.handle,
		ErrorHandler:       s.handleParseError,
		Name:               serverName,
		MaxRequestBodySize: s.cfg.MaxBodyBytes,
		ReadBufferSize:     s.cfg.MaxHeaderBytes, // holds any head the front door lets through (a longer one is its 431)
		ReadTimeout:        s.cfg.ReadTimeout,    // a client must send its request within this (slowloris)
		Concurrency:        s.cfg.MaxConnections, // connections over it get fasthttp's 503 and are closed
		IdleTimeout:        clientKeepAlive,
		// A response must be written within the idle timeout, so a client
		// that stops reading cannot hold its connection and a whole body
		// for good. A stream's relay moves the deadline on with each of its
		// writes (relay.armWrite), so this caps no stream's length.
		WriteTimeout:          s.cfg.IdleTimeout,
		WriteBufferSize:       serverWriteBufferSize,
		NoDefaultServerHeader: true,
		// Header names stay normalized (fasthttp's default): Peek matches
		// names exactly, and clients send them in any case — Node's fetch
		// and Envoy sidecars in lower case. Without it, such a client's
		// API key was not seen (401) nor its X-Request-Id or X-Session-Id.
		CloseOnShutdown: true,
		// Release the connection's read buffer (MaxHeaderBytes, 16 KiB by
		// default) once the request is read, and the write buffer between
		// responses: a stream would otherwise hold both for its whole life.
		ReduceMemoryUsage: true,
		// A hijacked stream hands its connection back to fasthttp when it
		// ends (hijack.go): fasthttp must not close it then.
		KeepHijackedConns: true,
		ConnState:         s.connState,
		// Parse errors must not quote the request: its headers may hold
		// an API key.
		SecureErrorLogMessage: true,
		// fasthttp logs every connection that ends in an error; a client
		// that hangs up is routine here (and already in the access log).
		Logger: fasthttpLogger{s.log},
	}
	return s, nil
}

// serverName is the Server field of the router's answers.
const serverName = "gpurouter"

// serverWriteBufferSize is a client connection's write buffer, which a
// stream holds until its last event (each event is flushed as it is
// written, so the buffer only ever holds one). A quarter of fasthttp's
// 4 KiB default: a response head with a reply of up to ~700 bytes, or an
// event (a few hundred bytes), goes out in one write(2); a larger chunk or
// reply takes one write(2) more, its bulk written straight from its own
// memory.
const serverWriteBufferSize = 1 << 10

// Handler is the router's request handler, for callers that run their own
// fasthttp.Server (tests, embedding). Such a server has no front door: the
// request grammar (frontdoor.go) guards the connections Serve accepts.
func (s *Server) Handler() fasthttp.RequestHandler { return s.handle }

// Serve accepts connections on ln until Shutdown, and runs the stream
// loops meanwhile (pump_linux.go). Streams still running when it returns
// go on on their own goroutines.
func (s *Server) Serve(ln net.Listener) error {
	ol := &onceListener{Listener: ln}
	s.lnMu.Lock()
	if s.draining.Load() { // Shutdown came first
		s.lnMu.Unlock()
		return ol.Close()
	}
	s.lns = append(s.lns, ol)
	s.lnMu.Unlock()
	ctx, stop := context.WithCancel(context.Background())
	looped := s.runStreamLoops(ctx)
	pl := prefetchListener{Listener: ol, max: s.cfg.MaxConnections, open: &s.conns, door: s.door}
	var served <-chan struct{}
	if served = s.runRequestLoops(ctx); len(s.reqLoops) > 0 {
		pl.take = s.takeConn
	}
	defer func() {
		// Requests in the request loops finish within the drain (or end
		// when its deadline passes): the listener closes first.
		s.waitRequestLoops()
		stop()
		<-looped
		<-served
	}()
	return s.srv.Serve(pl)
}

// onceListener closes its listener once: Shutdown closes the listeners
// Serve was given, and fasthttp's Shutdown closes them again, which must
// not fail it.
type onceListener struct {
	net.Listener
	once sync.Once
}

// Close closes the listener the first time and does nothing after.
func (l *onceListener) Close() error {
	var err error
	l.once.Do(func() { err = l.Listener.Close() })
	return err
}

// Shutdown stops accepting, lets requests in progress finish until ctx
// ends, then ends the streams still running (their clients get an error
// event and [DONE]) and waits briefly for them to close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	s.lnMu.Lock()
	for _, ln := range s.lns {
		ln.Close() //nolint:errcheck // Serve returns either way
	}
	s.lnMu.Unlock()
	s.wakeRequestLoops()
	s.kept.closeIdle()
	err := s.srv.ShutdownWithContext(ctx)
	if err == nil {
		err = s.waitStreams(ctx)
	}
	if err == nil {
		return nil
	}
	s.abortStreams.Store(true)
	s.wakeRequestLoops()
	s.stopBase(errDrainPassed)
	grace, cancel := context.WithTimeout(context.Background(), 2*time.Second+2*s.cfg.DisconnectCheck)
	defer cancel()
	err2 := s.srv.ShutdownWithContext(grace)
	if err2 == nil {
		err2 = s.waitStreams(grace)
	}
	if err2 != nil {
		return fmt.Errorf("proxy: shutdown: %d requests still open: %w", s.active.Load(), err2)
	}
	return nil
}

// waitStreams waits until no stream runs on a hijacked connection, which
// fasthttp's Shutdown does not wait for, or ctx ends. It polls, as
// fasthttp's own wait does: a stream may start while it waits.
func (s *Server) waitStreams(ctx context.Context) error {
	for s.streams.Load() > 0 || s.loopClients() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// Active is the number of requests in progress.
func (s *Server) Active() int64 { return s.active.Load() }

// serverName is the Server field fasthttp's server gives its answers
// (a request loop writes its own answers).
func (s *Server) serverName() string {
	if s.srv.Name == "" && !s.srv.NoDefaultServerHeader {
		return "fasthttp"
	}
	return s.srv.Name
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
