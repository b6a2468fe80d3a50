package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/gpurouter/gpurouter/balancer"
)

// LoRA adapters loaded on demand (balancer.LoRAConfig.LoadOnDemand): a
// request for an adapter placed on a replica not known to serve it
// (balancer.Replica.HasAdapter: its /v1/models does not list it and the
// router has not loaded it there) has the router load it there first,
// through vLLM's runtime API — POST /v1/load_lora_adapter {"lora_name",
// "lora_path"}, served with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True — then
// go there (flow.go: actLoad, between the lease and the send). The load
// blocks for as long as the engine reads the adapter, so a pool that
// loads on demand is served on fasthttp's goroutines, not a request loop
// (routeTable.goroutineOnly), as a split pool is.
//
// What the router knows of its loads: one that succeeded is the
// replica's (balancer.Replica.AdapterLoaded) until its next /v1/models
// read, which lists it if the engine still has it (fleet/adapters.go);
// one in flight is shared by every request that needs the same adapter
// on the same replica; one that failed is not tried again on that
// replica for the pool's LoadBackoff, and requests meanwhile get its
// error at once or another replica. So a broken runtime API costs one
// call per replica and adapter per backoff, never one per request.
//
// Left out: unloading adapters the router loaded. vLLM's slots are an
// LRU over the adapters it serves; an adapter served but idle costs its
// CPU cache entry only, and an unload would race the requests the
// balancer is placing there.

// ErrAdapterLoad is a LoRA adapter the router could not load on a
// replica (the engine refused, the runtime API is off, the call failed
// or timed out), and no other replica took the request.
var ErrAdapterLoad = errors.New("LoRA adapter could not be loaded")

// adapterLoadError is one failed load, as a client reads it: which
// adapter, where, what the engine said, and when the router tries again.
type adapterLoadError struct {
	adapter, replica string
	why              string
	retryAfter       time.Duration // until the backoff ends
}

func (e *adapterLoadError) Error() string {
	return fmt.Sprintf("%v: adapter %q on replica %s: %s (not tried there again for %v)",
		ErrAdapterLoad, e.adapter, e.replica, e.why, e.retryAfter.Round(time.Second))
}
func (e *adapterLoadError) Unwrap() error             { return ErrAdapterLoad }
func (e *adapterLoadError) RetryAfter() time.Duration { return e.retryAfter }

// loraAPIClient sends one runtime-API request to an engine: what a load
// needs of fasthttp's Client.
type loraAPIClient interface {
	DoTimeout(req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error
}

// adapterLoads is the router's loads in flight and failed, by replica
// and adapter. The zero value is not usable: newAdapterLoads builds it.
type adapterLoads struct {
	client loraAPIClient
	now    func() time.Time
	calls  *prometheus.CounterVec // model, result

	mu sync.Mutex
	m  map[loadKey]*adapterLoad
}

type loadKey struct {
	rep     *balancer.Replica
	adapter string
}

// adapterLoad is one load: in flight until done is closed, then failed
// (err) until until, or done (removed from the map: the replica has it).
type adapterLoad struct {
	done  chan struct{}
	err   *adapterLoadError
	until time.Time
}

// loadsPruneAt is how many entries the map holds before a new one first
// drops those whose backoff has passed.
const loadsPruneAt = 256

func newAdapterLoads(client loraAPIClient, now func() time.Time, calls *prometheus.CounterVec) *adapterLoads {
	return &adapterLoads{client: client, now: now, calls: calls, m: map[loadKey]*adapterLoad{}}
}

// newLoRAClient is the client of engines' runtime APIs: small answers,
// its own connections (the upstreams' carry the requests' deadlines).
func newLoRAClient(cfg Config) *fasthttp.Client {
	return &fasthttp.Client{Name: "gpurouter", NoDefaultUserAgentHeader: true, MaxResponseBodySize: 64 << 10,
		MaxConnsPerHost: 4, MaxIdleConnDuration: cfg.MaxIdleConnTime}
}

// ensure makes adapter served on rep within cfg's bounds: at once when
// rep has it, else the load in flight there or a new one. The load runs
// on its own goroutine, bounded by cfg's LoadTimeout, so a request that
// stops waiting — ctx ended: its client left, its total deadline passed —
// leaves it to finish for the requests that share it. The error is an
// *adapterLoadError (ErrAdapterLoad), or ctx's cause.
func (l *adapterLoads) ensure(ctx context.Context, rep *balancer.Replica, model, adapter string, cfg *balancer.LoRAConfig) error {
	if rep.HasAdapter(adapter) {
		return nil
	}
	timeout, backoff := cfg.LoadTimeout, cfg.LoadBackoff
	if timeout <= 0 {
		timeout = balancer.DefaultLoRALoadTimeout
	}
	if backoff <= 0 {
		backoff = balancer.DefaultLoRALoadBackoff
	}
	k := loadKey{rep, adapter}
	l.mu.Lock()
	if e, ok := l.m[k]; ok {
		select {
		case <-e.done:
			if now := l.now(); now.Before(e.until) {
				l.mu.Unlock()
				l.calls.WithLabelValues(model, "backoff").Inc()
				err := *e.err
				err.retryAfter = e.until.Sub(now)
				return &err
			}
			delete(l.m, k) // its backoff passed: load again
		default:
			l.mu.Unlock()
			return l.wait(ctx, e, timeout, adapter, rep, backoff)
		}
	}
	if len(l.m) >= loadsPruneAt {
		l.prune()
	}
	e := &adapterLoad{done: make(chan struct{})}
	l.m[k] = e
	l.mu.Unlock()
	go l.load(e, k, model, cfg.Paths[adapter], timeout, backoff)
	return l.wait(ctx, e, timeout, adapter, rep, backoff)
}

// load is one load e of k, on its own goroutine: its outcome recorded
// and e.done closed, within timeout.
func (l *adapterLoads) load(e *adapterLoad, k loadKey, model, path string, timeout, backoff time.Duration) {
	why, already := l.call(k.rep, k.adapter, path, timeout)
	l.mu.Lock()
	defer l.mu.Unlock()
	defer close(e.done)
	if why == "" {
		result := "loaded"
		if already {
			result = "already_loaded"
		}
		l.calls.WithLabelValues(model, result).Inc()
		k.rep.AdapterLoaded(k.adapter)
		delete(l.m, k)
		return
	}
	l.calls.WithLabelValues(model, "failed").Inc()
	e.until = l.now().Add(backoff)
	e.err = &adapterLoadError{adapter: k.adapter, replica: k.rep.Name(), why: why, retryAfter: backoff}
}

// loadGuard is how much longer than a load's timeout a request waits for
// its outcome before giving up on it as stuck: the load's own timeout
// ends it first, with the engine's reason.
const loadGuard = time.Second

// wait is a request's share of the load e: its outcome; ctx's cause when
// ctx ends first (the load goes on for the others); an error when it
// does not end within timeout and loadGuard (the load itself is bounded
// by timeout: this only guards against a stuck one).
func (l *adapterLoads) wait(ctx context.Context, e *adapterLoad, timeout time.Duration, adapter string, rep *balancer.Replica, backoff time.Duration) error {
	t := time.NewTimer(timeout + loadGuard)
	defer t.Stop()
	select {
	case <-e.done:
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return &adapterLoadError{adapter: adapter, replica: rep.Name(), why: "the load in flight did not end within " + (timeout + loadGuard).String(), retryAfter: backoff}
	}
	if e.err == nil { // written before done closed
		return nil
	}
	err := *e.err
	return &err
}

// prune drops the failed loads whose backoff has passed. l.mu is held.
func (l *adapterLoads) prune() {
	now := l.now()
	for k, e := range l.m {
		select {
		case <-e.done:
			if !now.Before(e.until) {
				delete(l.m, k)
			}
		default:
		}
	}
}

// call is one POST /v1/load_lora_adapter to rep: why it failed ("" when
// the engine serves the adapter now), and whether it had it already —
// vLLM refuses to load a name twice with a 400 that says so, which is
// what a load racing the /v1/models read, or another router's, gets.
func (l *adapterLoads) call(rep *balancer.Replica, adapter, path string, timeout time.Duration) (why string, already bool) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(rep.URL() + "/v1/load_lora_adapter")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	body, _ := json.Marshal(struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}{adapter, path})
	req.SetBody(body)
	if err := l.client.DoTimeout(req, resp, timeout); err != nil {
		if errors.Is(err, fasthttp.ErrTimeout) {
			return "the load did not answer within " + timeout.String(), false
		}
		return "the load call failed: " + err.Error(), false
	}
	st := resp.StatusCode()
	switch {
	case st == fasthttp.StatusOK:
		return "", false
	case st == fasthttp.StatusBadRequest && bytes.Contains(resp.Body(), []byte("already been loaded")):
		return "", true
	case st == fasthttp.StatusNotFound && !bytes.Contains(resp.Body(), []byte(adapter)):
		// vLLM has no such route without VLLM_ALLOW_RUNTIME_LORA_UPDATING.
		return "the engine answered 404: its runtime LoRA API is off (VLLM_ALLOW_RUNTIME_LORA_UPDATING)", false
	}
	return "the engine answered " + strconv.Itoa(st) + ": " + engineMessage(resp.Body()), false
}

// engineMessage is the message of an engine's error answer: vLLM's
// {"error":{"message"}} or {"message"}, FastAPI's {"detail"}, else the
// body's start.
func engineMessage(body []byte) string {
	var doc struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
		Message string `json:"message"`
		Detail  any    `json:"detail"`
	}
	if json.Unmarshal(body, &doc) == nil {
		switch {
		case doc.Error != nil && doc.Error.Message != "":
			return doc.Error.Message
		case doc.Message != "":
			return doc.Message
		case doc.Detail != nil:
			return fmt.Sprint(doc.Detail)
		}
	}
	const most = 200
	if len(body) > most {
		body = body[:most]
	}
	return strconv.Quote(string(body))
}

// actLoad: load the request's adapter on rep (Server.loadAdapter), under
// lease, then loaded. The goroutine path's only: a pool that loads is
// not served on a request loop (routeTable.goroutineOnly).
const actLoad act = 96

// needsLoad reports whether the attempt leased on f.rep must load the
// request's adapter there first.
func (f *flow) needsLoad() bool {
	p := f.x.route.Pool
	cfg := p.LoRA()
	if f.plainOnly || !cfg.LoadOnDemand {
		return false
	}
	a := p.AdapterOf(f.x.req.Model)
	return a != "" && cfg.Loadable(a) && !f.rep.HasAdapter(a)
}

// loadAdapter is actLoad: the request's adapter loaded on f.rep, or why
// not. The request's watch (w, started here if no attempt started it)
// ends its wait when the client leaves or its total deadline passes: a
// load can take up to the pool's LoadTimeout, longer than a request may
// have left.
func (s *Server) loadAdapter(f *flow, w **clientWatch, client net.Conn) error {
	p := f.x.route.Pool
	cfg := p.LoRA()
	ctx, cancel := context.WithCancelCause(s.base)
	defer cancel(nil)
	if *w == nil {
		*w = s.startWatch(f.x, client, nil)
	}
	(*w).retarget(abortFunc(cancel))
	defer (*w).retarget(nil)
	return s.loads.ensure(ctx, f.rep, p.Model(), p.AdapterOf(f.x.req.Model), &cfg)
}

// loaded goes on after actLoad: err nil sends the request; else nothing
// was sent — no attempt, and no fault of the replica's for its breaker,
// which serves the base model and other adapters — and another replica
// may take it at once (one that has the adapter, or loads it); none
// left, the client reads err.
func (f *flow) loaded(err error) act {
	if err == nil {
		f.x.sent = f.s.now()
		f.traceAttempt(f.rep)
		return actSend
	}
	f.sending = false
	f.x.attempts--
	f.lease.Done(errors.Join(err, balancer.ErrNotReplicaFault))
	if !errors.Is(err, ErrAdapterLoad) {
		return f.end(err) // the watch's cause: the client left, the deadline passed
	}
	return f.retry(err)
}
