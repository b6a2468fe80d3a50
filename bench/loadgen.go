package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gpurouter/gpurouter/bench/tokens"
)

// Endpoints the load generator speaks.
const (
	EndpointCompletions = "/v1/completions"
	EndpointChat        = "/v1/chat/completions"
)

// ErrConfig is wrapped by every error about a load generator Config.
var ErrConfig = errors.New("bench: config")

// Config describes one benchmark run. Zero values mean the documented
// defaults; BaseURL, Model and Requests are required.
type Config struct {
	// BaseURL is the server (router or engine): scheme, host, port and an
	// optional path prefix, e.g. http://127.0.0.1:8000.
	BaseURL string
	// MoreBaseURLs are further servers of the same service, e.g. several
	// routers behind one Kubernetes Service: request i (and warm-up i) goes
	// to the (i mod n)-th of BaseURL followed by these, round-robin as a
	// Service spreads connections. Empty (the zero value) means BaseURL
	// alone.
	MoreBaseURLs []string
	// Endpoint is appended to BaseURL. "" means /v1/completions (vllm
	// bench's default); a path ending in /chat/completions sends chat
	// bodies.
	Endpoint string
	// Model is the "model" field of every request.
	Model string
	// Requests are sent in order.
	Requests []Request
	// Timed sends each request at its own Arrival (trace replay) instead of
	// drawing arrivals from RequestRate and Burstiness.
	Timed bool
	// RequestRate is the mean arrival rate in requests per second; 0 or +Inf
	// sends everything at once.
	RequestRate float64
	// Burstiness is the gamma shape of inter-arrival gaps; 0 means 1
	// (Poisson). See Arrivals.
	Burstiness float64
	// Seed drives the arrival process.
	Seed uint64
	// MaxConcurrency caps requests in flight; 0 means no cap.
	MaxConcurrency int
	// IgnoreEOS adds "ignore_eos": true so the engine generates exactly
	// max_tokens.
	IgnoreEOS bool
	// NumWarmups sends that many copies of the first request before the
	// run (at most MaxConcurrency at a time); they are kept in
	// Result.Warmups and excluded from every metric.
	NumWarmups int
	// RequestIDPrefix prefixes each X-Request-Id (prefix + index); "" means
	// "bench-".
	RequestIDPrefix string
	// Headers are added to every request (e.g. Authorization).
	Headers map[string]string
	// Timeout bounds each request from send to the end of its stream; 0
	// means none (vllm bench allows 6 h).
	Timeout time.Duration
	// CountEmptyChunks counts every chunk with a non-empty choices array as
	// an output chunk, as vllm bench literally does, instead of only chunks
	// carrying text (DESIGN.md's definition, the default).
	CountEmptyChunks bool
	// MaxConns caps connections to the server; 0 means one per request that
	// can be in flight.
	MaxConns int
	// Estimator synthesises prompts for Requests without Prompt text;
	// required only then.
	Estimator *tokens.Estimator
	// Clock is the time source; nil means the real clock.
	Clock Clock
	// Progress receives a progress bar; nil draws none.
	Progress io.Writer
	// OnMeasureStart, if set, is called after the warm-ups and before the
	// first measured request is scheduled: the place to scrape servers'
	// metrics so their deltas cover exactly the measured requests.
	OnMeasureStart func(ctx context.Context)
}

func (c *Config) endpoint() string {
	if c.Endpoint == "" {
		return EndpointCompletions
	}
	return c.Endpoint
}

// baseURLs is BaseURL followed by MoreBaseURLs: the servers requests are
// spread over.
func (c *Config) baseURLs() []string {
	return append([]string{c.BaseURL}, c.MoreBaseURLs...)
}

// Validate reports every problem with c, joined.
func (c *Config) Validate() error {
	var errs []error
	for _, b := range c.baseURLs() {
		if u, err := url.Parse(b); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%w: base URL %q: want http(s)://host[:port]", ErrConfig, b))
		}
	}
	if !strings.HasPrefix(c.endpoint(), "/") {
		errs = append(errs, fmt.Errorf("%w: endpoint %q must start with /", ErrConfig, c.Endpoint))
	}
	if c.Model == "" {
		errs = append(errs, fmt.Errorf("%w: no model", ErrConfig))
	}
	if len(c.Requests) == 0 {
		errs = append(errs, fmt.Errorf("%w: no requests", ErrConfig))
	}
	if c.RequestRate < 0 || math.IsNaN(c.RequestRate) {
		errs = append(errs, fmt.Errorf("%w: request rate %v < 0", ErrConfig, c.RequestRate))
	}
	if c.Burstiness < 0 || math.IsNaN(c.Burstiness) {
		errs = append(errs, fmt.Errorf("%w: burstiness %v < 0", ErrConfig, c.Burstiness))
	}
	if c.MaxConcurrency < 0 || c.NumWarmups < 0 || c.MaxConns < 0 || c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("%w: max concurrency, warm-ups, max conns and timeout must not be negative", ErrConfig))
	}
	synth := false
	for i, r := range c.Requests {
		if r.OutputTokens < 1 {
			errs = append(errs, fmt.Errorf("%w: request %d: output tokens %d < 1", ErrConfig, i, r.OutputTokens))
			break
		}
		if r.Prompt == "" && r.PromptTokens < 1 {
			errs = append(errs, fmt.Errorf("%w: request %d: no prompt and no prompt length", ErrConfig, i))
			break
		}
		synth = synth || r.Prompt == ""
	}
	if synth && c.Estimator == nil {
		errs = append(errs, fmt.Errorf("%w: requests without prompt text need an Estimator to synthesise one", ErrConfig))
	}
	return errors.Join(errs...)
}

// Result is one run's raw measurements: everything the reports need, per
// request, so later analyses (router records, A/B, plots) can join on ID.
type Result struct {
	// Start is when the first measured request was scheduled (after the
	// warm-ups); Record offsets count from it.
	Start time.Time
	// Duration is from Start until the last request finished (vllm's
	// benchmark duration).
	Duration time.Duration
	// Records has one entry per request sent, in Config.Requests order. A
	// cancelled run has fewer.
	Records []Record
	// Warmups are the warm-up requests, not part of any metric.
	Warmups []Record
	// MaxInFlight is the most requests the generator had in flight at once.
	MaxInFlight int

	// What was run, for reports.
	BaseURL, Endpoint, Model string
	RequestRate, Burstiness  float64
	MaxConcurrency           int
	Timed                    bool
}

// Run sends c.Requests and measures each stream. It returns when every
// request has finished. If ctx ends first, open streams are closed, unsent
// requests are dropped, and Run returns what it measured with ctx's error.
func Run(ctx context.Context, c Config) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	g, err := newGenerator(ctx, &c)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, g.conns.closeAll)
	defer stop()
	defer func() {
		for _, t := range g.targets {
			t.hc.CloseIdleConnections()
		}
	}()

	res := &Result{
		BaseURL: c.BaseURL, Endpoint: c.endpoint(), Model: c.Model,
		RequestRate: c.RequestRate, Burstiness: c.Burstiness, MaxConcurrency: c.MaxConcurrency, Timed: c.Timed,
	}
	if c.NumWarmups > 0 {
		res.Warmups = g.warmUp(ctx)
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
	var offsets []time.Duration
	if c.Timed {
		offsets = make([]time.Duration, len(c.Requests))
		for i, r := range c.Requests {
			offsets[i] = r.Arrival
		}
	} else {
		offsets = Arrivals(len(c.Requests), c.RequestRate, c.Burstiness, newRand(c.Seed))
	}
	if c.OnMeasureStart != nil {
		c.OnMeasureStart(ctx)
	}
	g.maxInFlight.Store(0)
	res.Start = g.clock.Now()
	g.progress = &progress{w: c.Progress, clock: g.clock, total: len(c.Requests), start: res.Start}
	res.Records = g.dispatch(ctx, res.Start, offsets)
	res.Duration = g.clock.Now().Sub(res.Start)
	res.MaxInFlight = int(g.maxInFlight.Load())
	return res, ctx.Err()
}

// generator is one Run's state.
type generator struct {
	cfg      *Config
	clock    Clock
	targets  []target // request i goes to targets[i mod len]
	conns    *connTracker
	chat     bool
	prefix   string
	sem      chan struct{}
	bufs     sync.Pool
	progress *progress

	inFlight, maxInFlight atomic.Int64
}

// target is one server a run sends to: its connection pool and the
// request URL.
type target struct {
	hc  *fasthttp.HostClient
	url string
}

func newGenerator(ctx context.Context, c *Config) (*generator, error) {
	maxConns := c.MaxConns
	if maxConns == 0 {
		maxConns = len(c.Requests) + c.NumWarmups
		if c.MaxConcurrency > 0 {
			maxConns = min(maxConns, c.MaxConcurrency)
		}
	}
	g := &generator{
		cfg:    c,
		clock:  c.Clock,
		conns:  newConnTracker(ctx),
		chat:   strings.HasSuffix(c.endpoint(), "/chat/completions"),
		prefix: c.RequestIDPrefix,
	}
	if g.clock == nil {
		g.clock = realClock{}
	}
	if g.prefix == "" {
		g.prefix = "bench-"
	}
	if c.MaxConcurrency > 0 {
		g.sem = make(chan struct{}, c.MaxConcurrency)
	}
	g.bufs.New = func() any { b := make([]byte, 4096); return &b }
	for _, b := range c.baseURLs() {
		t, err := g.newTarget(b, maxConns)
		if err != nil {
			return nil, err
		}
		g.targets = append(g.targets, t)
	}
	return g, nil
}

// newTarget makes the connection pool for one base URL; each server may
// get up to maxConns connections.
func (g *generator) newTarget(baseURL string, maxConns int) (target, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return target{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	hc := &fasthttp.HostClient{
		Addr:               addr,
		Name:               "gpurouter-bench",
		IsTLS:              u.Scheme == "https",
		StreamResponseBody: true,
		MaxConns:           maxConns,
		// Below uvicorn's 5 s keep-alive, newest connection first
		// (fasthttp-notes.md).
		MaxIdleConnDuration: 4 * time.Second,
		ConnPoolStrategy:    fasthttp.LIFO,
		// A waiting Do must not fail with ErrNoFreeConns when MaxConns is
		// set below the concurrency.
		MaxConnWaitTimeout: 24 * time.Hour,
		Dial:               g.conns.dial,
	}
	return target{hc: hc, url: strings.TrimRight(baseURL, "/") + g.cfg.endpoint()}, nil
}

// warmUp sends NumWarmups copies of the first request, at most
// MaxConcurrency at a time, and waits for them.
func (g *generator) warmUp(ctx context.Context) []Record {
	recs := make([]Record, g.cfg.NumWarmups)
	req := g.cfg.Requests[0]
	var wg sync.WaitGroup
	start := g.clock.Now()
	for i := range recs {
		if g.sem != nil {
			select {
			case g.sem <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return recs[:i]
			}
		}
		recs[i] = Record{Index: i, ID: fmt.Sprintf("%swarmup-%d", g.prefix, i)}
		wg.Add(1)
		go func(rec *Record) {
			defer wg.Done()
			now := g.clock.Now()
			g.send(ctx, &req, rec, start, now, now)
			g.release()
		}(&recs[i])
	}
	wg.Wait()
	return recs
}

// dispatch sends request i at start+offsets[i] and waits for all of them.
//
// Time before sending is split in two: ClientQueue, spent waiting for a
// concurrency slot, and Lag, the generator's own delay. A slot that frees
// late holds up every request behind it (the queue is FIFO), so the latest
// time a blocked request got its slot counts as queueing for the requests
// that follow, not as lag.
func (g *generator) dispatch(ctx context.Context, start time.Time, offsets []time.Duration) []Record {
	recs := make([]Record, len(offsets))
	var wg sync.WaitGroup
	var lastBlockedAcq time.Time
	n := 0
loop:
	for i, off := range offsets {
		sched := start.Add(off)
		if d := sched.Sub(g.clock.Now()); d > 0 {
			if g.clock.Sleep(ctx, d) != nil {
				break
			}
		}
		if ctx.Err() != nil {
			break
		}
		ready := sched
		if lastBlockedAcq.After(ready) {
			ready = lastBlockedAcq
		}
		if g.sem != nil {
			select {
			case g.sem <- struct{}{}:
			default:
				select {
				case g.sem <- struct{}{}:
				case <-ctx.Done():
					break loop
				}
				lastBlockedAcq = g.clock.Now()
				if lastBlockedAcq.After(ready) {
					ready = lastBlockedAcq
				}
			}
		}
		recs[i] = Record{Index: i, ID: g.prefix + itoa(i), Scheduled: off, ClientQueue: ready.Sub(sched)}
		n = i + 1
		wg.Add(1)
		go func(req *Request, rec *Record) {
			defer wg.Done()
			g.send(ctx, req, rec, start, sched, ready)
			g.release()
			g.progress.finished(rec.OK())
		}(&g.cfg.Requests[i], &recs[i])
	}
	wg.Wait()
	return recs[:n]
}

// release frees a concurrency slot taken before the request was sent.
func (g *generator) release() {
	if g.sem != nil {
		<-g.sem
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
