//go:build linux

package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/fasthttp"
)

// loopReq is a request the loop serves, from its head to its answer: the
// loop's side of proxyAPI's locals.
type loopReq struct {
	gen  uint64 // which of its connection's requests it is: what goroutines post for an earlier one is stale
	ctx  *fasthttp.RequestCtx
	hdr  clientHeaders // views of ctx's headers
	x    *exchange
	rt   *routeTable
	body []byte // what goes to the engine (the client's, clamped)
	// wire is the request sent to the replica tried now; its first head
	// bytes, all but the Host line (the replica's), are the same for
	// every replica tried (upstreamWire).
	wire     []byte
	head     int
	pick     balancer.Request
	tried    []*balancer.Replica
	triedArr [8]*balancer.Replica
	lastErr  error

	phase loopPhase
	// The attempt in progress.
	rep   *balancer.Replica
	up    *upstream
	lease balancer.Lease
	u     *loopConn // its engine connection; nil while it is dialed

	strip   bool          // a stream's: drop the usage chunk the router asked for (plan)
	closing bool          // a stream's: its head said Connection: close
	sentAt  time.Time     // the loop's clock when the request went (the stream's first-byte deadline)
	stream  *detachedBody // its stream, while the loop relays it

	actx   context.Context         // an admission wait's; its cause says why it ended early
	cancel context.CancelCauseFunc // ends an admission wait
	orphan bool                    // the client left during the admission wait: its goroutine finishes the exchange
}

type loopPhase uint8

const (
	phaseAdmitting  loopPhase = iota + 1 // waiting in the admission queue, on a goroutine
	phaseRetrying                        // pausing before the next attempt, on a goroutine (pause)
	phaseConnecting                      // a new engine connection is being dialed
	phaseAwaiting                        // sent: the engine's answer is coming
	phaseStreaming                       // its stream is relayed by the loop (reqloop_stream_linux.go)
)

// newReq readies c's request struct for its next request: one struct a
// connection, as a connection carries one request at a time, made for
// its first whole request (a stream's connection, handed off, has none).
func (l *requestLoop) newReq(c *loopConn, ctx *fasthttp.RequestCtx) *loopReq {
	if c.req == nil {
		c.req = new(loopReq)
	}
	r := c.req
	*r = loopReq{gen: r.gen + 1, ctx: ctx, wire: r.wire[:0]}
	r.tried = r.triedArr[:0]
	return r
}

// releaseReq ends r: what goroutines post for it from now on is stale.
func (l *requestLoop) releaseReq(r *loopReq) {
	r.gen++
	r.ctx, r.x, r.body, r.lastErr, r.hdr = nil, nil, nil, nil, clientHeaders{}
	clear(r.triedArr[:])
}

// start serves a whole request read from c, its head parsed into ctx, at
// the start of b, what c sent and the loop has not served: the steps of
// proxyAPI (handler.go), each through the same function. False when c
// was handed off with b instead.
func (l *requestLoop) start(c *loopConn, ctx *fasthttp.RequestCtx, b []byte) bool {
	s := l.s
	rt := s.routes.Load()
	ep, prefix := rt.apiRoute(bytesView(requestPath(ctx)))
	if ep == 0 || s.draining.Load() {
		l.releaseCtx(ctx)
		l.handOff(c, b)
		return false
	}
	// The body is read before the key is checked, only to choose the
	// path: a stream, or a body fasthttp's path must refuse, goes there
	// with nothing done, and is read again there in proxyAPI's order.
	req, err := s.readBody(ctx.PostBody(), ep)
	if err != nil || req.stream && !l.streamsOnLoop() || !l.routable(rt, prefix, req.model) {
		l.releaseCtx(ctx)
		l.handOff(c, b)
		return false
	}
	r := l.newReq(c, ctx)
	c.r = r
	r.rt = rt
	r.hdr = readClientHeaders(&ctx.Request.Header)
	x := s.newExchange(ctx, ep, r.hdr.requestID)
	r.x = x
	if err := s.authenticate(r.hdr.authorization, x); err != nil {
		l.reject(c, err)
		return true
	}
	x.req = req
	if r.body, r.strip, err = s.plan(ctx, &r.hdr, x, rt, prefix, ctx.PostBody()); err != nil {
		l.reject(c, err)
		return true
	}
	wait, err := s.admitNow(x)
	switch {
	case err != nil:
		l.reject(c, err)
	case wait:
		l.admitLater(c)
	default:
		l.place(c)
	}
	return true
}

// routable reports a request whose every replica the loop can reach:
// none behind TLS, which the loop does not speak.
func (l *requestLoop) routable(rt *routeTable, prefix *poolRoute, model string) bool {
	if !rt.tls {
		return true // no pool has one: no lookup, and no error words built twice for an unknown model
	}
	route, err := l.s.routeFor(rt, model, prefix)
	return err != nil || !route.tls
}

// admitLater waits for admission on a goroutine, which owns the exchange
// until it hands it back.
func (l *requestLoop) admitLater(c *loopConn) {
	r := c.r
	r.phase = phaseAdmitting
	actx, cancel := context.WithCancelCause(l.s.base)
	r.actx, r.cancel = actx, cancel
	gen := r.gen
	go func() {
		err := l.s.admitWait(actx, r.x)
		if !l.post(func() { cancel(nil); l.admitted(c, r, gen, err) }) {
			// The loop stopped: the exchange is still this goroutine's.
			cancel(nil)
			if err == nil {
				err = errLoopStopped
			}
			l.s.reject(r.ctx, r.x, err)
		}
	}()
}

func (l *requestLoop) admitted(c *loopConn, r *loopReq, gen uint64, err error) {
	if r.gen != gen {
		return
	}
	if r.orphan {
		if err == nil {
			err = context.Cause(r.actx)
		}
		l.s.reject(r.ctx, r.x, err)
		l.releaseCtx(r.ctx)
		l.releaseReq(r)
		return
	}
	r.phase = 0
	if err != nil {
		l.reject(c, err)
		return
	}
	l.place(c)
}

// place is steps 4–5: the pick, the upstream request, the first attempt.
func (l *requestLoop) place(c *loopConn) {
	r := c.r
	r.pick = r.x.pickRequest()
	if err := sloOf(&r.hdr, &r.pick); err != nil {
		l.reject(c, err)
		return
	}
	if r.x.req.stream && r.x.mig == nil {
		// A stream that may outlive its replica asks for what continuing
		// it needs (migrate.go), as upstreamRequest has it.
		r.body = l.s.startMigration(r.ctx, r.x, r.body)
	}
	l.upstreamWire(r)
	l.attempt(c)
}

// attempt tries replicas as proxyAPI's loop does, until one is sent the
// request, a pause is due, or the request ends.
func (l *requestLoop) attempt(c *loopConn) {
	r, s, x := c.r, l.s, c.r.x
	for {
		rep := x.route.Pool.PickExcept(&r.pick, r.tried)
		x.arm = r.pick.Arm
		if rep == nil {
			l.endAttempts(c, x.noReplica(r.lastErr))
			return
		}
		r.tried = append(r.tried, rep)
		if rep.TLS() {
			// Added to the pool over TLS since the request was routed
			// (routable): not routable from the loop.
			continue
		}
		up, lease, err := s.beginAttempt(r.rt, x, rep)
		if up != nil {
			r.rep, r.up, r.lease = rep, up, lease
			l.sendRequest(c)
			return
		}
		if err != nil {
			r.lastErr = err
		}
		if !l.pause(c) {
			return
		}
	}
}

// pause is retryWait's decision on the loop: true to try again now; else
// the request ended, or pauses — on a goroutine, with the server's sleep
// (Options.Sleep), as retryWait does — and goes on when it posts back
// (resumeAttempts).
func (l *requestLoop) pause(c *loopConn) bool {
	r := c.r
	d, err := l.s.retryDelay(r.x, r.lastErr)
	switch {
	case err != nil:
		l.endAttempts(c, err)
		return false
	case d == 0:
		return true
	}
	r.phase = phaseRetrying
	gen, sleep := r.gen, l.s.sleep
	go func() {
		sleep(d)
		l.post(func() { l.resumeAttempts(c, r, gen) })
	}()
	return false
}

// resumeAttempts goes on with c's request r after its retry pause, unless
// it has ended meanwhile (its client left, a deadline passed).
func (l *requestLoop) resumeAttempts(c *loopConn, r *loopReq, gen uint64) {
	if c.r != r || r.gen != gen || r.phase != phaseRetrying {
		return
	}
	r.phase = 0
	if err := l.s.retryAfterWait(r.x, &r.pick, r.lastErr); err != nil {
		l.endAttempts(c, err)
		return
	}
	l.attempt(c)
}

// retry follows an attempt that failed with err: another replica, or the
// end.
func (l *requestLoop) retry(c *loopConn, err error) {
	c.r.lastErr = err
	c.r.phase = 0
	if l.pause(c) {
		l.attempt(c)
	}
}

// answer relays the engine's whole response (judged first: a refusal or
// a 502 tries another replica), as respondWhole does.
func (l *requestLoop) answer(c *loopConn, resp *fasthttp.Response) {
	r, s := c.r, l.s
	r.phase = 0
	if err := s.judge(r.x, r.rep, r.lease, resp); err != nil {
		fasthttp.ReleaseResponse(resp)
		l.retry(c, err)
		return
	}
	r.x.answered(r.up, r.lease)
	l.placed(r)
	s.respondWhole(r.ctx, r.x, resp, nil)
	l.respond(c)
}

// placed ends the attempts.
func (l *requestLoop) placed(r *loopReq) {
	r.x.placed()
}

// endAttempts answers the client with err: no replica took the request.
func (l *requestLoop) endAttempts(c *loopConn, err error) {
	l.placed(c.r)
	l.reject(c, err)
}

// reject answers with err (s.reject: the exchange finishes).
func (l *requestLoop) reject(c *loopConn, err error) {
	r := c.r
	r.phase = 0
	l.s.reject(r.ctx, r.x, err)
	l.respond(c)
}

// abort ends c's request for cause without answering (the client is
// gone, or the loop stops).
func (l *requestLoop) abort(c *loopConn, cause error) {
	r := c.r
	if r.phase == phaseStreaming {
		l.abortStream(r, cause) // its relay ends it (reqloop_stream_linux.go)
		return
	}
	c.r = nil
	if r.phase == phaseAdmitting {
		// The admission's goroutine owns the exchange: it finishes it
		// once the wait ends (admitted).
		r.orphan = true
		r.cancel(cause)
		return
	}
	l.drop(r, cause)
	l.s.reject(r.ctx, r.x, cause)
	l.releaseCtx(r.ctx)
	l.releaseReq(r)
}

// drop gives up the attempt in progress for cause, if any: its engine
// connection closes (the engine stops generating) and its lease ends.
func (l *requestLoop) drop(r *loopReq, cause error) {
	switch r.phase {
	case phaseAwaiting, phaseConnecting:
		if u := r.u; u != nil {
			u.peer = nil
			l.closeUpstream(u)
			r.u = nil
		}
		abandon(r.lease, cause)
		l.placed(r)
	case phaseRetrying:
		l.placed(r)
	}
	r.phase = 0
}

// scanRequest ends a request past a deadline: the total one (as the
// client watch does), the first byte's or an idle gap's (as the engine
// connection's deadlines do).
func (l *requestLoop) scanRequest(c *loopConn, aborting bool) {
	r, s := c.r, l.s
	switch {
	case r.phase == phaseAdmitting, r.phase == phaseStreaming:
		return // its goroutine's (the admission queue has its own deadline); the stream relay's
	case aborting:
		l.end(c, fmt.Errorf("%w: drain deadline passed", ErrShuttingDown))
	case s.exceededAt(r.x, s.now()): // the exchange's clock (Options.Now), not the loop's
		l.end(c, fmt.Errorf("%w: total request deadline %s", ErrTimeout, s.cfg.TotalTimeout))
	case r.phase == phaseAwaiting && r.u != nil:
		u := r.u
		switch {
		case !u.head && l.now.Sub(r.sentAt) > s.cfg.FirstByteTimeout:
			l.upstreamFailed(c, u, fasthttp.ErrTimeout)
		case u.head && l.now.Sub(u.last) > s.cfg.IdleTimeout:
			l.upstreamFailed(c, u, fasthttp.ErrTimeout)
		}
	}
}

// end answers c's request with err after dropping its attempt.
func (l *requestLoop) end(c *loopConn, err error) {
	l.drop(c.r, err)
	l.reject(c, err)
}

var errNoLoopConn = errors.New("proxy: no engine connection")
