package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/gpurouter/gpurouter/bench/tokens"
	"github.com/gpurouter/gpurouter/kvevents"
	"github.com/gpurouter/gpurouter/prefixcache"
)

// ReplicaConfig configures one simulated vLLM replica. Only Profile is
// required.
type ReplicaConfig struct {
	Profile Profile
	// ServedModelNames are the names the replica answers to, like vLLM's
	// --served-model-name: the first one appears in responses and in the
	// model_name metric label, the others are aliases. Empty = the
	// profile's model name.
	ServedModelNames []string
	// Index is the replica's position in a fleet; it only names things (GPU
	// UUID, host name in /v1/gpus).
	Index int
	// Speed divides every step's duration: 0.5 is a replica half as fast as
	// its profile says (heterogeneous fleets). 0 = 1.
	Speed float64
	// Registry receives the replica's metrics and is what /metrics serves.
	// nil = a fresh registry. Never the global one: each replica needs its
	// own, since all register the same names.
	Registry *prometheus.Registry
	// Estimator counts prompt tokens. nil = tokens.New() (the router's own
	// estimator, so both sides count alike). Share one across replicas: it
	// is safe for concurrent use and costly to build.
	Estimator *tokens.Estimator
	// LegacyMetrics exposes the KV gauge under its pre-0.10 name
	// vllm:gpu_cache_usage_perc instead of vllm:kv_cache_usage_perc.
	LegacyMetrics bool
	// Faults are in effect from the start; see SetFaults.
	Faults Faults
	// Seed makes output lengths and error-rate draws reproducible.
	Seed uint64
	// Tokenizer tokenizes prompts when prefix caching is on (blocks are
	// hashed over real token ids). nil = prefixcache.NewBPE("")
	// (cl100k_base); share one across replicas.
	Tokenizer *prefixcache.BPE
	// KVEvents, when set, publishes the engine's KV-cache events as vLLM
	// does when started with --kv-events-config (needs prefix caching).
	KVEvents *KVEventsConfig
	// LoRAModules are the adapters served from the start, as vLLM's
	// --lora-modules; they need Profile.Engine.EnableLoRA. A request
	// names its adapter as its model.
	LoRAModules []LoRAModule
	// KVTransfer, when set, makes the replica a NixlConnector replica of a
	// prefill/decode split (kvtransfer.go), as vLLM's --kv-transfer-config;
	// nil = no connector: kv_transfer_params are ignored, as vLLM does.
	KVTransfer *KVTransferConfig
	// AllowRuntimeLoRAUpdating serves POST /v1/load_lora_adapter and
	// /v1/unload_lora_adapter, as vLLM does with
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; without it they are 404.
	AllowRuntimeLoRAUpdating bool
	// SpinWait is how long before a step's intended end the real-time loop
	// stops sleeping and busy-waits, trading CPU for timing precision (Go's
	// timers wake with about 1 ms granularity). 0 = 1ms; negative = never
	// spin. A fleet uses its first replica's value for its shared loop.
	SpinWait time.Duration
}

func (c ReplicaConfig) spinWait() time.Duration {
	switch {
	case c.SpinWait < 0:
		return 0
	case c.SpinWait == 0:
		return time.Millisecond
	}
	return c.SpinWait
}

// Replica is one simulated vLLM server: an engine (scheduler, KV cache, cost
// model), its HTTP API and its metrics. Build with NewReplica, then run the
// engine with Run and serve HTTP with Serve (or mount Handler); both stop
// when their context is cancelled. Methods are safe for concurrent use.
type Replica struct {
	cfg      ReplicaConfig
	names    []string // served model names, first = primary
	est      *tokens.Estimator
	bpe      *prefixcache.BPE
	pub      *kvevents.Publisher // nil: KV events off
	hashSeed uint64              // the engine's block-hash seed (random per vLLM process)
	reg      *prometheus.Registry
	m        *engineMetrics
	expo     *exposition
	d        derived
	words    [][]byte       // filler tokens for generated text
	vocab    map[string]int // words' indices, by the word without its space (text.go)
	created  int64          // for /v1/models
	profName string

	mu      sync.Mutex // guards eng, rng, nextID, lag
	eng     *engine
	rng     *rand.Rand
	nextID  uint64
	lag     lagRing
	running bool // Run is active

	wake    atomic.Pointer[chan struct{}] // the driver's: a request arrived; nil before Run
	stopped chan struct{}                 // closed when Run returns
	crashCh chan time.Duration
	// faultsChanged tells Serve that the faults changed (cap 1), so it
	// reschedules periodic crashes.
	faultsChanged chan struct{}

	faults    atomic.Pointer[Faults]
	warmStart atomic.Int64 // unix nanos of the last (re)start, for slow start
	downUntil atomic.Int64 // unix nanos; >now while crashed
	busyNanos atomic.Int64 // modelled GPU time spent in steps
	inflight  atomic.Int64 // inference requests being answered (GET /load)
	gpuMeter  gpuMeter

	waiting waitSet // requests that have written nothing yet

	traces traceLog // the trace context of each inference request (TraceContexts)

	// adapters are the LoRA adapters served (never nil after NewReplica);
	// loads and unloads replace the set under loraMu, which also guards
	// nextLoRAID.
	adapters   atomic.Pointer[adapterSet]
	loraMu     sync.Mutex
	nextLoRAID int

	// The KV connector (kvtransfer*.go), with KVTransfer only: its
	// effective config, the side channel's listener (bound once; a crash
	// listens again at kvAddr), the decode side's client and its reads in
	// flight.
	kvc      KVTransferConfig
	kvLn     net.Listener
	kvAddr   atomic.Pointer[string]
	kvClient *http.Client
	pulls    sync.WaitGroup
}

// NewReplica builds a replica. It starts nothing and binds nothing.
func NewReplica(cfg ReplicaConfig) (*Replica, error) {
	p := cfg.Profile
	if err := p.Validate(); err != nil {
		return nil, err
	}
	d, _ := p.derive()
	if cfg.Speed < 0 {
		return nil, fmt.Errorf("sim: replica %d: speed %v < 0", cfg.Index, cfg.Speed)
	}
	if cfg.Speed == 0 {
		cfg.Speed = 1
	}
	if err := cfg.Faults.validate(); err != nil {
		return nil, fmt.Errorf("sim: replica %d: %w", cfg.Index, err)
	}
	est := cfg.Estimator
	if est == nil {
		var err error
		if est, err = tokens.New(); err != nil {
			return nil, err
		}
	}
	bpe := cfg.Tokenizer
	if bpe == nil {
		var err error
		if bpe, err = prefixcache.NewBPE(""); err != nil {
			return nil, err
		}
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	names := cfg.ServedModelNames
	if len(names) == 0 {
		names = []string{p.Model.Name}
	}
	m := newEngineMetrics(reg, metricsOptions{modelName: names[0], maxModelLen: d.maxModelLen,
		legacyKV: cfg.LegacyMetrics, cacheInfo: cacheInfo(p, d), maxLoRAs: d.lora.maxLoRAs, kvTransfer: cfg.KVTransfer != nil})
	eng, err := newEngine(p, m)
	if err != nil {
		return nil, err
	}
	r := &Replica{
		cfg: cfg, names: names, est: est, reg: reg, m: m, expo: &exposition{gatherer: reg}, d: d,
		words: fillerWords(), vocab: vocabIndex(fillerWords()), created: time.Now().Unix(), profName: p.Name,
		eng: eng, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.Index))),
		stopped: make(chan struct{}), crashCh: make(chan time.Duration, 1),
		faultsChanged: make(chan struct{}, 1),
		bpe:           bpe, hashSeed: mix64(cfg.Seed, uint64(cfg.Index)+0x6b76),
	}
	if err := r.setupLoRA(cfg.LoRAModules); err != nil {
		return nil, fmt.Errorf("sim: replica %d: %w", cfg.Index, err)
	}
	if cfg.KVEvents != nil {
		if err := r.setupKVEvents(*cfg.KVEvents); err != nil {
			return nil, fmt.Errorf("sim: replica %d: %w", cfg.Index, err)
		}
	}
	if cfg.KVTransfer != nil {
		if err := r.setupKVTransfer(*cfg.KVTransfer); err != nil {
			return nil, fmt.Errorf("sim: replica %d: %w", cfg.Index, err)
		}
		r.kvClient = newKVClient()
	}
	f := cfg.Faults
	f.CrashSeconds = 0
	r.faults.Store(&f)
	return r, nil
}

// ModelName is the primary served model name.
func (r *Replica) ModelName() string { return r.names[0] }

// Profile is the profile the replica was built with.
func (r *Replica) Profile() Profile { return r.cfg.Profile }

// Registry is the replica's metrics registry.
func (r *Replica) Registry() *prometheus.Registry { return r.reg }

// NumGPUBlocks is the KV cache capacity in blocks.
func (r *Replica) NumGPUBlocks() int { return r.d.numGPUBlocks }

// EngineState is a point-in-time view of the engine, for tests and tools.
type EngineState struct {
	Running, Waiting int
	KVUsage          float64 // as vllm:kv_cache_usage_perc
	UsedBlocks       int     // blocks referenced by live sequences
	Preemptions      int
	// LoRAInGPU and LoRAInCPU are the adapters in GPU slots and in the CPU
	// cache, least recently used first; LoRASwapsCPU and LoRASwapsDisk
	// count the swaps into GPU slots by where from. Empty without LoRA.
	LoRAInGPU, LoRAInCPU        []string
	LoRASwapsCPU, LoRASwapsDisk int
}

// State reports the engine's current state.
func (r *Replica) State() EngineState {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.eng
	used := 0
	for _, c := range e.kv.ref {
		if c > 0 {
			used++
		}
	}
	st := EngineState{Running: len(e.running), Waiting: e.waiting.len(), KVUsage: e.kv.usage(),
		UsedBlocks: used, Preemptions: e.preemptions}
	if le := e.lora; le != nil {
		st.LoRAInGPU, st.LoRAInCPU = names(le.gpu), names(le.cpu)
		st.LoRASwapsCPU, st.LoRASwapsDisk = le.swaps[swapFromCPU], le.swaps[swapFromDisk]
	}
	return st
}

// speedFactor is the divisor of modelled step time right now.
func (r *Replica) speedFactor(now time.Time) float64 {
	f := r.faults.Load()
	s := r.cfg.Speed
	if f.Speed > 0 {
		s *= f.Speed
	}
	if f.SlowStartSeconds > 0 {
		if since := now.Sub(time.Unix(0, r.warmStart.Load())); since < time.Duration(f.SlowStartSeconds*1e9) {
			s /= f.slowStartFactor()
		}
	}
	return s
}

// incarnation is one life of the HTTP server between start and a crash or
// shutdown: its connections and a channel that tells its handlers to give
// up.
type incarnation struct {
	r    *Replica
	quit chan struct{}

	mu    sync.Mutex // guards conns, closed
	conns map[net.Conn]struct{}
	done  bool
}

func (r *Replica) newIncarnation() *incarnation {
	return &incarnation{r: r, quit: make(chan struct{}), conns: make(map[net.Conn]struct{})}
}

func (inc *incarnation) server() *fasthttp.Server {
	return &fasthttp.Server{
		Handler: inc.handle,
		Name:    "uvicorn",
		// No IdleTimeout: connState applies KeepAliveTimeoutSeconds (5 s,
		// uvicorn's, by default) so that the fault can change it at run time.
		ReadBufferSize:     16 << 10, // request headers (bodies are not limited by it)
		MaxRequestBodySize: 64 << 20,
		ConnState:          inc.connState,
		CloseOnShutdown:    true,
		Logger:             discardLogger{}, // aborted streams are routine here
		// fasthttp's worker-pool cleaner sleeps this long between checks,
		// so it is also how long it outlives a stopped server.
		MaxIdleWorkerDuration: time.Second,
	}
}

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}

// connState tracks the incarnation's connections and times out idle
// keep-alive ones. fasthttp calls it on the connection's own goroutine, so
// the read deadlines it sets can't race with fasthttp's reads.
func (inc *incarnation) connState(c net.Conn, s fasthttp.ConnState) {
	switch s {
	case fasthttp.StateIdle:
		// fasthttp's next read (the first byte of the next request) fails
		// at the deadline, and it closes the connection, as uvicorn does.
		_ = c.SetReadDeadline(time.Now().Add(inc.r.faults.Load().keepAliveTimeout()))
		return
	case fasthttp.StateActive:
		_ = c.SetReadDeadline(time.Time{}) // a request is being read: no idle limit
		return
	}
	inc.mu.Lock()
	defer inc.mu.Unlock()
	switch s {
	case fasthttp.StateNew:
		if inc.done || inc.r.isDown(time.Now()) {
			resetConn(c)
			return
		}
		inc.conns[c] = struct{}{}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		delete(inc.conns, c)
	}
}

// closeConns resets every open connection (a crash or shutdown).
func (inc *incarnation) closeConns() {
	inc.mu.Lock()
	defer inc.mu.Unlock()
	for c := range inc.conns {
		resetConn(c)
	}
}

// resetConn closes c with a TCP reset rather than a FIN: the peer's next
// read or write fails with ECONNRESET. Of what a client may see from a
// killed replica (a FIN, then a reset on its next write; a reset; nothing),
// this is the one it can't mistake for a polite close.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// served is one server of an incarnation on its listener.
type served struct {
	srv  *fasthttp.Server
	ln   net.Listener
	errc chan error
}

// serve starts srv on ln.
func (inc *incarnation) serve(srv *fasthttp.Server, ln net.Listener) served {
	s := served{srv: srv, ln: ln, errc: make(chan error, 1)}
	go func() { s.errc <- srv.Serve(ln) }()
	return s
}

// stop ends the incarnation: no new connections, handlers told to give up,
// connections closed, then waits for the servers to finish.
func (inc *incarnation) stop(ss ...served) {
	inc.mu.Lock()
	inc.done = true
	inc.mu.Unlock()
	for _, s := range ss {
		_ = s.ln.Close()
	}
	close(inc.quit)
	inc.closeConns()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range ss {
		_ = s.srv.ShutdownWithContext(ctx)
		<-s.errc
	}
}

// lagRing keeps the most recent step lags for StepLag.
type lagRing struct {
	buf  []time.Duration
	next int
	n    int
}

const lagRingSize = 1 << 16

func (l *lagRing) add(d time.Duration) {
	if l.buf == nil {
		l.buf = make([]time.Duration, lagRingSize)
	}
	l.buf[l.next] = d
	l.next = (l.next + 1) % lagRingSize
	l.n++
}

// LagStats summarises how late the real-time loop ended its steps (actual −
// intended end time) over the most recent steps (up to 65,536).
type LagStats struct {
	Steps         int // steps measured in total
	P50, P99, Max time.Duration
}

// StepLag reports the real-time loop's timing error. The same numbers feed
// the gpurouter_sim_step_lag_seconds histogram.
func (r *Replica) StepLag() LagStats {
	r.mu.Lock()
	n := min(r.lag.n, lagRingSize)
	xs := make([]time.Duration, n)
	copy(xs, r.lag.buf[:n])
	total := r.lag.n
	r.mu.Unlock()
	s := summarize(xs)
	var mx time.Duration
	for _, x := range xs {
		mx = max(mx, x)
	}
	return LagStats{Steps: total, P50: s.Median, P99: s.P99, Max: mx}
}

// ResetStepLag forgets the lag measured so far (e.g. after warm-up).
func (r *Replica) ResetStepLag() {
	r.mu.Lock()
	r.lag = lagRing{}
	r.mu.Unlock()
}

func fillerWords() [][]byte {
	const text = "the of and to in is that for it as with was on be at by this had not are but from or have an " +
		"they which one you were her all she there would their we him been has when who will more no if out so " +
		"said what up its about into than them can only other new some could time these"
	var out [][]byte
	for _, w := range strings.Fields(text) {
		out = append(out, []byte(" "+w))
	}
	return out
}

var errRunTwice = errors.New("sim: Replica.Run called twice")
