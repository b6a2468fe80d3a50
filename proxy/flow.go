package proxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/gpurouter/gpurouter/tracing"
	"github.com/valyala/fasthttp"
)

// One API request, top to bottom, whichever path serves it.
//
// A flow holds a request's decisions and nothing else: each step is a
// method that decides, and returns the I/O to do next (an act). Two
// drivers do that I/O and call the flow back with what came of it:
//
//   - the goroutine path (handler.go: proxyAPI), on fasthttp's goroutine
//     per connection, does each act at once, blocking;
//   - a request loop (reqloop_exchange_linux.go: act), on Linux, starts
//     each without blocking and comes back on the event that ends it.
//
// Neither decides anything about the request: the steps, their order,
// when a replica may be tried again, what a failure means and the words
// the client reads are here and in the functions named, each once.
//
//  1. read: the client's API key first, then the body, parsed once   begin     (clients.go, request.go)
//  2. plan: the pool, the output cap, the request's one cost,        begin     (plan.go, admit.go: steer)
//     the key's model and rate limits, the admission headers
//  3. admit: at once, or wait in the pool's queue (actAdmit)         admitted  (admit.go)
//     split: a pool with prefill replicas prefills a long prompt on   place     (disagg.go)
//     one of them first (actPrefillAdmit, actPrefill), then steps
//     4–6 send the request with its KV to a decode replica
//  4. pick a replica by the pool's policy, lease it                  next      (forward.go: beginAttempt)
//  5. send (actSend); before any byte reached the client, a failure, failed,   (forward.go: attemptFailed,
//     a refusal or a 502 tries another after a pause (actPause),     answered,  judge; upfail.go)
//     up to MaxAttempts, within the total deadline                   resume
//  6. relay: a 200 event stream event by event (actStream), any     answered  (respond.go, relay.go,
//     other answer whole (actWhole)                                            wholebody.go)
//  7. finish, once the answer is written or the client gone:                   (exchange.go: finish)
//     lease, ticket, metrics, record, access log line
//
// Anything that ends a request early — the client leaves, a deadline
// passes (timeouts.go), the router stops — is abandon, from any step.
// Each step reports its span to the request's trace (trace.go: a nil
// check while tracing is off).
type flow struct {
	s   *Server
	ctx *fasthttp.RequestCtx // the client's request, and the answer built for it
	x   *exchange
	rt  *routeTable // the routes the request was routed with
	hdr clientHeaders

	body  []byte // what the replicas are sent: the client's, clamped, with the usage option (plan)
	strip bool   // hide the usage chunk the router asked a stream's engine for (plan)

	pick     balancer.Request
	tried    []*balancer.Replica
	triedArr [8]*balancer.Replica
	lastErr  error // why the last replica tried did not answer
	from     int32 // x.attempts when the flow's attempts began (a continuation's: migrate_resume.go)

	// The attempt in progress, from actSend until the engine's answer or
	// its failure: the exchange holds it from then on (took).
	rep     *balancer.Replica
	up      *upstream
	lease   balancer.Lease
	sending bool

	delay     time.Duration // actPause's
	placing   bool          // attempts have begun: their end records the queue time (settle)
	plainOnly bool          // the driver reaches no replica behind TLS (a request loop)
	cont      bool          // a continuation of a stream already answered (migrate_resume.go): its end is its caller's
	err       error         // a continuation's end: why it found no replica

	pd pdFlow // a split request's prefill step (disagg.go)
}

// act is the I/O a flow asks of its driver next.
type act uint8

const (
	// actAnswer: the answer is on ctx (an error's, or the engine's whole
	// answer): write it. The exchange finishes once it is written.
	actAnswer act = iota + 1
	// actAdmit: wait in the pool's admission queue (Server.admitWait),
	// watching the client; then admitted.
	actAdmit
	// actSend: send the request to rep, on up, under lease: then
	// answered with the answer's head (or whole), failed, or abandon.
	actSend
	// actPause: wait delay (Options.Sleep), then resume.
	actPause
	// actStream: relay the answer's event stream (respond.go: startStream).
	actStream
	// actWhole: read the answer's body (within MaxResponseBytes) and
	// write it (respond.go: respondWhole), or bodyFailed.
	actWhole
)

// begin is steps 1–3 of a request for endpoint ep of rt (prefix: its
// path's pool, nil to route by the body's model). From here the request is
// counted (Server.Active) and finishes exactly once.
func (f *flow) begin(ep openai.Endpoint, prefix *poolRoute) act {
	s, ctx := f.s, f.ctx
	f.hdr = readClientHeaders(&ctx.Request.Header)
	f.x = s.newExchange(ctx, ep, f.hdr.requestID)
	x := f.x
	if s.draining.Load() {
		return f.end(ErrShuttingDown)
	}
	// 1. The API key before anything else, when keys are configured: a
	// client without one learns nothing, not even which models exist.
	// Then the body, parsed once.
	if err := s.authenticate(f.hdr.authorization, x); err != nil {
		return f.end(err)
	}
	var err error
	if x.req, err = s.readBody(ctx.PostBody(), ep, x.promptSink(f.rt)); err != nil {
		return f.end(err)
	}
	// 2. The pool, the request's cost, the key's model and limits.
	if f.body, f.strip, err = s.plan(ctx, &f.hdr, x, f.rt, prefix, ctx.PostBody()); err != nil {
		return f.end(err)
	}
	f.traceStart()
	// 3. Admission: a pool with room admits at once; while it is
	// saturated the request waits at the router, shortest expected work
	// first, instead of in an engine's queue.
	wait, err := s.admitNow(x)
	switch {
	case err != nil:
		return f.end(err)
	case wait:
		f.traceQueued()
		return actAdmit
	}
	return f.place()
}

// admitted is step 3's end after a wait: err is why the request was shed,
// or why the wait ended (the client left, the router stops).
func (f *flow) admitted(err error) act {
	f.traceAdmitted(err)
	if err != nil {
		return f.end(err)
	}
	return f.place()
}

// place readies steps 4–5: what the picker reads (the replicas' state as
// it is now, the request's objectives), and a stream that may outlive its
// replica asks the engine for what continuing it needs (migrate.go).
func (f *flow) place() act {
	x := f.x
	f.pick = x.pickRequest()
	if err := sloOf(&f.hdr, &f.pick); err != nil {
		return f.end(err)
	}
	if x.mig == nil {
		f.body = f.s.startMigration(f.ctx, x, f.body)
	}
	f.tried, f.from, f.placing = f.triedArr[:0], x.attempts, true
	if a, split := f.splitPlace(); split {
		return a
	}
	return f.next()
}

// next is steps 4–5's loop: the pool's policy picks a replica not tried
// yet, and the request is leased there and sent (actSend). A replica
// that can't take it (an open breaker, one just added) is passed over;
// a pause comes between attempts (actPause); none left ends it.
func (f *flow) next() act {
	x := f.x
	for {
		var t0 time.Time
		if x.tr.Recording() {
			t0 = f.s.now()
		}
		rep := x.route.Pool.PickExcept(&f.pick, f.tried)
		x.arm = f.pick.Arm
		if x.tr.Recording() {
			f.tracePick(t0, rep)
		}
		if rep == nil && f.decodeFallback() {
			continue // a split's decode step found no replica: colocated (disagg.go)
		}
		if rep == nil {
			return f.end(x.noReplica(f.lastErr))
		}
		f.tried = append(f.tried, rep)
		if f.plainOnly && rep.TLS() {
			continue // added over TLS since the request was routed
		}
		up, lease, err := f.s.beginAttempt(f.rt, x, rep, &f.pick)
		if up != nil {
			f.rep, f.up, f.lease, f.sending = rep, up, lease, true
			if f.needsLoad() {
				// Leased first: requests arriving during the load see
				// the replica's load, and spread within the bound.
				return actLoad
			}
			x.sent = f.s.now()
			f.traceAttempt(rep)
			return actSend
		}
		if err != nil {
			f.lastErr = err
		}
		if a, again := f.pause(); !again {
			return a
		}
	}
}

// pause decides the wait before the next try: none while no attempt has
// gone out (again), full-jitter backoff after one (actPause); or the end,
// the attempts used up.
func (f *flow) pause() (a act, again bool) {
	d, err := f.s.retryDelay(int(f.x.attempts-f.from), f.x, f.lastErr)
	switch {
	case err != nil:
		return f.end(err), false
	case d == 0:
		return 0, true
	}
	f.delay = d
	return actPause, false
}

// resume goes on after a pause: within the total deadline, with the
// replicas' state judged anew.
func (f *flow) resume() act {
	now := f.s.now()
	if f.s.to.totalPassed(f.x.received, now) != nil {
		return f.end(fmt.Errorf("%w: total deadline passed while retrying (%v)", ErrTimeout, f.lastErr))
	}
	f.pick.Now = now
	return f.next()
}

// failed is the attempt in progress ended by err before its answer's
// head: nothing reached the client, so another replica may take it.
func (f *flow) failed(err error) act {
	f.sending = false
	err = f.s.attemptFailed(f.x, f.rep, f.lease, err)
	f.traceAttemptEnd(0, err)
	return f.retry(err)
}

// retry tries another replica after err, why the last one did not
// answer (nil: nothing was sent).
func (f *flow) retry(err error) act {
	if err != nil {
		f.lastErr = err
	}
	if a, again := f.pause(); !again {
		return a
	}
	return f.next()
}

// answered judges the engine's answer, its head in resp (its body too on
// a loop): a refusal (429, 503) or a 502 tries another replica — the
// driver lets resp go — else it is the answer, relayed as a stream when it
// is a 200 event stream, else whole.
func (f *flow) answered(resp *fasthttp.Response) act {
	f.traceFirstByte(resp.StatusCode())
	if err := f.s.judge(int(f.x.attempts-f.from), f.x, f.rep, f.lease, resp); err != nil {
		f.sending = false
		f.traceAttemptEnd(resp.StatusCode(), err)
		return f.retry(err)
	}
	f.took()
	if resp.StatusCode() == fasthttp.StatusOK && isEventStream(resp) {
		f.x.tr.RelayStart(f.x.firstByte)
		return actStream
	}
	if f.cont {
		// The replica refused the continuation itself (a model whose chat
		// template can't continue a message): not its failure.
		f.x.lease.Done(balancer.ErrNotReplicaFault)
		f.x.lease = balancer.Lease{}
		f.err = fmt.Errorf("replica %s answered the continuation with %d", f.rep.Name(), resp.StatusCode())
		f.x.tr.AttemptEnd(f.s.now(), tracing.AttemptResult{Status: resp.StatusCode()})
		return actAnswer
	}
	f.x.tr.RelayStart(f.x.firstByte)
	return actWhole
}

// took makes the attempt in progress the exchange's: its answer is the
// request's, and its attempts are over.
func (f *flow) took() {
	if f.sending {
		f.sending = false
		f.x.answered(f.up, f.lease)
	}
	f.settle()
}

// bodyFailed ends a request whose answer's body could not be read whole
// (err): its head had come, so no other replica may take it.
func (f *flow) bodyFailed(err error) act {
	f.took()
	name := f.x.up.replica.Name()
	switch {
	case isTimeout(err):
		err = &upstreamFailure{kind: ErrTimeout, words: "replica " + name + " stopped sending its response", cause: err}
	case !errors.Is(err, ErrUpstream) && !errors.Is(err, ErrClientGone):
		err = &upstreamFailure{kind: ErrUpstream, words: "replica " + name + ": " + streamWords(err) + " during the response", cause: err}
	}
	return f.end(err)
}

// tooLarge is the error of an answer over MaxResponseBytes.
func (f *flow) tooLarge() error {
	return fmt.Errorf("%w: response over %d bytes", ErrUpstream, f.s.cfg.MaxResponseBytes)
}

// abandon ends the request for cause whatever it waits for — the client
// left, a deadline passed, the router stops: the attempt in progress is
// given up (its lease ends; only a timeout is the replica's fault), and
// the client, if still there, is told why.
func (f *flow) abandon(cause error) act {
	if f.sending {
		f.sending = false
		abandon(f.lease, cause)
		f.traceAbandoned(cause)
	}
	return f.end(cause)
}

// end answers with err: the request ends before its answer started. A
// continuation's end is its stream's (f.err).
func (f *flow) end(err error) act {
	f.prefillOver()
	if f.cont {
		f.err = err
		return actAnswer
	}
	f.settle()
	f.traceStart()
	f.s.reject(f.ctx, f.x, err)
	return actAnswer
}

// settle records the request's queue time once its attempts are over:
// from its arrival to its admission or, without admission, to its last
// attempt.
func (f *flow) settle() {
	if !f.placing {
		return
	}
	f.placing = false
	x := f.x
	if a := x.admittedAt(); !a.IsZero() {
		x.route.queue.Observe(a.Sub(x.received).Seconds())
		x.recordQueue(a)
	}
}
