//go:build linux

package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/fasthttp"
)

// loopReq is a request the loop serves, from its head to its answer: its
// flow (flow.go), which decides everything, and the loop's side of the
// I/O the flow asks for.
type loopReq struct {
	f   flow
	gen uint64 // which of its connection's requests it is: what goroutines post for an earlier one is stale
	// wire is the request sent to the replica tried now; its first head
	// bytes, all but the Host line (the replica's), are the same for
	// every replica tried (upstreamWire).
	wire []byte
	head int

	phase loopPhase
	u     *loopConn // the attempt's engine connection; nil while it is dialed

	closing bool          // a stream's: its head said Connection: close
	sentAt  time.Time     // the loop's clock when the request went (the first-byte deadline)
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
// its first request (a stream's connection, handed off, has none).
func (l *requestLoop) newReq(c *loopConn, ctx *fasthttp.RequestCtx, rt *routeTable) *loopReq {
	if c.req == nil {
		c.req = new(loopReq)
	}
	r := c.req
	*r = loopReq{gen: r.gen + 1, wire: r.wire[:0]}
	r.f = flow{s: l.s, ctx: ctx, rt: rt, plainOnly: true}
	return r
}

// releaseReq ends r: what goroutines post for it from now on is stale.
func (l *requestLoop) releaseReq(r *loopReq) {
	r.gen++
	r.f = flow{}
}

// start serves a request read from c, its head parsed into ctx, at the
// start of b, what c sent and the loop has not served. False when c was
// handed off with b instead, before anything was done: a request for the
// router's own endpoints, or one that may go to a pool behind TLS, which
// the loop does not speak — the head says which, the body is not read.
func (l *requestLoop) start(c *loopConn, ctx *fasthttp.RequestCtx, b []byte) bool {
	rt := l.s.routes.Load()
	ep, prefix := rt.apiRoute(openai.BytesView(requestPath(ctx)))
	if ep == 0 || rt.tls && (prefix == nil || prefix.tls) {
		l.releaseCtx(ctx)
		l.handOff(c, b)
		return false
	}
	r := l.newReq(c, ctx, rt)
	c.r = r
	l.act(c, r.f.begin(ep, prefix))
	return true
}

// act does what c's request's flow asks next, without blocking the loop:
// what would block — an admission wait, a new engine connection, a
// retry's pause — runs on a goroutine that posts its end back, and an
// engine's answer comes as its socket's events (reqloop_upstream_linux.go),
// each handed to the flow in turn.
func (l *requestLoop) act(c *loopConn, a act) {
	r := c.r
	r.phase = 0
	switch a {
	case actAdmit:
		l.admitLater(c)
	case actSend:
		l.sendRequest(c)
	case actPause:
		l.pause(c)
	default: // actAnswer: an answer is on the context
		l.respond(c)
	}
}

// admitLater waits for admission on a goroutine, which owns the exchange
// until it hands it back.
func (l *requestLoop) admitLater(c *loopConn) {
	r := c.r
	r.phase = phaseAdmitting
	actx, cancel := context.WithCancelCause(l.s.base)
	r.actx, r.cancel = actx, cancel
	gen, x := r.gen, r.f.x
	go func() {
		err := l.s.admitWait(actx, x)
		if !l.post(func() { cancel(nil); l.admitted(c, r, gen, err) }) {
			// The loop stopped: the exchange is still this goroutine's.
			cancel(nil)
			if err == nil {
				err = errLoopStopped
			}
			r.f.abandon(err)
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
		r.f.abandon(err)
		l.releaseCtx(r.f.ctx)
		l.releaseReq(r)
		return
	}
	l.act(c, r.f.admitted(err))
}

// pause sleeps the flow's pause on a goroutine, with the server's sleep
// (Options.Sleep), and goes on when it posts back.
func (l *requestLoop) pause(c *loopConn) {
	r := c.r
	r.phase = phaseRetrying
	gen, sleep, d := r.gen, l.s.sleep, r.f.delay
	go func() {
		sleep(d)
		l.post(func() { l.resume(c, r, gen) })
	}()
}

// resume goes on with c's request r after its pause, unless it has ended
// meanwhile (its client left, a deadline passed).
func (l *requestLoop) resume(c *loopConn, r *loopReq, gen uint64) {
	if c.r != r || r.gen != gen || r.phase != phaseRetrying {
		return
	}
	l.act(c, r.f.resume())
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
	l.drop(r)
	r.f.abandon(cause)
	l.releaseCtx(r.f.ctx)
	l.releaseReq(r)
}

// drop closes the engine connection of the attempt in progress, if any:
// the engine stops generating. The flow's abandon ends its lease.
func (l *requestLoop) drop(r *loopReq) {
	if u := r.u; u != nil {
		u.peer = nil
		l.closeUpstream(u)
		r.u = nil
	}
	r.phase = 0
}

// scanRequest ends a request past a deadline (timeouts.go): the drain's
// and the total one (as the client watch does), the first byte's or an
// idle gap's (as the engine connection's deadlines do).
func (l *requestLoop) scanRequest(c *loopConn, aborting bool) {
	r, s := c.r, l.s
	switch {
	case r.phase == phaseAdmitting, r.phase == phaseStreaming:
		return // its goroutine's (the admission queue has its own deadline); the stream relay's
	case aborting:
		l.end(c, errDrainPassed)
		return
	}
	if err := s.to.totalPassed(r.f.x.received, s.now()); err != nil { // the exchange's clock (Options.Now), not the loop's
		l.end(c, err)
		return
	}
	if u := r.u; r.phase == phaseAwaiting && u != nil {
		last := u.last
		if !u.head {
			last = time.Time{} // the first byte's deadline, from sentAt
		}
		if s.to.readLate(r.sentAt, last, l.now) {
			l.upstreamFailed(c, u, fasthttp.ErrTimeout)
		}
	}
}

// end answers c's request with err, its attempt in progress given up.
func (l *requestLoop) end(c *loopConn, err error) {
	r := c.r
	l.drop(r)
	l.act(c, r.f.abandon(err))
}

var errNoLoopConn = errors.New("proxy: no engine connection")
