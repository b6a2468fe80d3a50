package proxy

import (
	"errors"
	"io"
	"slices"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// The switch: a stream whose upstream failed after its first byte goes on
// on another replica, or — when it can't — fails as before.

// migratable reports an upstream failure a continuation can mend: the
// connection reset or closed without [DONE], the stream idle past its
// timeout, the replica leaving its pool. Not: the client leaving, the
// router stopping, the total deadline, the engine's own error event, an
// engine that never sent a first event.
func migratable(err error, gotBody bool) bool {
	return errors.Is(err, errBrokenStream) || errors.Is(err, errLeaving) ||
		(gotBody && errors.Is(err, ErrTimeout))
}

// resume continues the stream on another replica after its upstream failed
// with cause; false when it can't, and the relay fails as before. It runs
// on the relay's goroutine, inside Read: the client sees a pause.
func (r *relay) resume(cause error) bool {
	x := r.x
	m := x.mig
	if r.errEv || r.abortErr.Load() != nil || !migratable(cause, r.gotBody) {
		return false
	}
	s := x.s
	if m == nil {
		if x.route != nil && x.route.Migration.Max > 0 && x.last != nil {
			s.m.mig.result(x.route.Pool.Model(), x.last.Name(), "not_continuable")
		}
		return false
	}
	model, from := x.route.Pool.Model(), x.last.Name()
	if m.finished {
		// The engine had finished: only the end of the stream was lost.
		r.dropUpstream(cause, nil)
		r.endLocally()
		return true
	}
	switch {
	case m.off != nil:
		s.m.mig.result(model, from, "not_continuable")
		return false
	case m.left <= 0:
		m.stop(errMigrationUsed)
		s.m.mig.result(model, from, "not_continuable")
		return false
	}
	if len(m.tried) == 0 {
		m.tried = append(m.tried, x.last)
	}
	m.lostAt = x.lastTok
	if m.lostAt.IsZero() {
		m.lostAt = s.now()
	}
	x.traceMigration(m.migrations+1, from, cause)
	leaving := errors.Is(cause, errLeaving)
	old := upstreamState{x.up, x.rm, x.lease, x.last, r.body, r.resp}
	if !leaving {
		// The dead upstream goes: its stream, its response, its lease —
		// a failure of the replica, which its breaker counts.
		r.dropUpstream(cause, cause)
	}
	body, err := m.continuation()
	if err == nil {
		err = r.switchTo(body)
	}
	if err != nil {
		if leaving {
			// Still streaming where it is: it finishes there.
			x.up, x.rm, x.lease, x.last = old.up, old.rm, old.lease, old.last
		}
		m.stop(err)
		if r.abortErr.Load() != nil {
			// Not a failure to move: the client left, or the router is
			// stopping, or the total deadline passed (upstreamFailed).
			s.m.mig.result(model, from, "abandoned")
			x.traceMoved("", "abandoned")
			return false
		}
		s.m.mig.result(model, from, "failed")
		x.traceMoved("", "failed")
		s.log.Warn("stream not continued", zap.String("request_id", x.id), zap.String("replica", from),
			zap.NamedError("cause", cause), zap.Error(err))
		return false
	}
	if leaving {
		// A replica being drained is not failing: its lease ends clean
		// of blame, and closing its stream aborts the sequence there.
		old.body.CloseWithError(cause)
		if old.resp != nil {
			fasthttp.ReleaseResponse(old.resp)
		}
		old.lease.Done(balancer.ErrNotReplicaFault)
	}
	m.left--
	m.migrations++
	s.m.mig.result(model, from, "continued")
	x.traceMoved(x.last.Name(), "")
	return true
}

// upstreamState is what the exchange and relay hold of one upstream.
type upstreamState struct {
	up    *upstream
	rm    *replicaMetrics
	lease balancer.Lease
	last  *balancer.Replica
	body  fasthttp.ReadCloserWithError
	resp  *fasthttp.Response
}

// dropUpstream lets the current upstream stream go (closed with closeErr,
// which aborts the engine's sequence if it still runs) and ends its lease
// with leaseErr (nil: a success).
func (r *relay) dropUpstream(closeErr, leaseErr error) {
	x, m := r.x, r.x.mig
	m.mu.Lock()
	if !m.bodyClosed {
		r.body.CloseWithError(closeErr)
	}
	r.body, m.bodyClosed = closedBody{}, true
	m.mu.Unlock()
	if r.resp != nil {
		fasthttp.ReleaseResponse(r.resp)
		r.resp = nil
	}
	x.lease.Done(leaseErr)
	x.lease = balancer.Lease{}
	r.in = r.buf[:0]
}

// switchTo sends body to another replica — any not tried yet, picked by
// the pool's policy, with the request path's attempts and pauses (a
// flow's steps 4–5, as a continuation: flow.go) — and makes its stream
// the relay's.
func (r *relay) switchTo(body []byte) error {
	x, m := r.x, r.x.mig
	s := x.s
	sent, firstByte := x.sent, x.firstByte // the request's, not the continuation's
	defer func() { x.sent, x.firstByte = sent, firstByte }()
	f := s.flows.Get().(*flow)
	defer func() { *f = flow{}; s.flows.Put(f) }()
	*f = flow{s: s, ctx: m.ctx, x: x, rt: s.routes.Load(), body: body, cont: true, tried: m.tried, from: x.attempts}
	f.pick = x.pickRequest()
	f.pick.Now = s.now()
	client := m.ctx.Conn()
	if m.client != nil {
		client = m.client
	}
	var w *clientWatch // the relay's own watch goes on meanwhile
	resp, a := s.attempts(f, f.next(), &w, client)
	fired := w.why()
	w.stop()
	m.tried = f.tried
	if fired != nil {
		// The watch ended the request: the relay's own would tell the
		// relay the same a check later.
		r.abort(fired)
		return fired
	}
	if a != actStream {
		return f.err
	}
	r.swap(resp)
	return nil
}

// swap makes resp's stream the relay's, unless the client left meanwhile.
func (r *relay) swap(resp *fasthttp.Response) {
	m := r.x.mig
	body := resp.BodyStream().(fasthttp.ReadCloserWithError)
	m.mu.Lock()
	r.body, r.resp, m.bodyClosed = body, resp, false
	if ap := r.abortErr.Load(); ap != nil {
		r.body.CloseWithError(*ap) // the next read fails, and fill ends the stream
		m.bodyClosed = true
	}
	m.mu.Unlock()
	r.in, r.gotBody = r.buf[:0], false
	m.before = m.tokens
	m.cont, m.contFirst = true, true
}

// endLocally ends a stream whose engine had finished generating when its
// connection went: the usage chunk (if the client asked for it and it was
// lost) and [DONE], as the engine would have sent them.
func (r *relay) endLocally() {
	x, m := r.x, r.x.mig
	if !x.gotUsage {
		prompt := m.promptN
		if prompt == 0 {
			prompt = x.cost.PromptTokens
		}
		x.promptTokens, x.completionTokens, x.gotUsage = int32(prompt), int32(m.tokens), true
		if !r.strip && len(m.buf.id) > 0 {
			r.out = append(r.out, `data: {"id":`...)
			r.out = append(r.out, m.buf.id...)
			if m.chat {
				r.out = append(r.out, `,"object":"chat.completion.chunk"`...)
			} else {
				r.out = append(r.out, `,"object":"text_completion"`...)
			}
			r.out = append(r.out, `,"created":`...)
			r.out = append(r.out, m.buf.created...)
			r.out = append(r.out, `,"choices":[],"usage":`...)
			r.out = appendUsageJSON(r.out, int(x.promptTokens), int(x.completionTokens))
			r.out = append(r.out, "}\n\n"...)
		}
	}
	r.out = append(r.out, doneEvent...)
	r.sawDone, r.eof = true, true
}

// leaving reports that the stream's replica has been draining or out of
// its pool for longer than the grace period: time to move. It looks at
// most every leaveCheck, on the relay's reads.
func (m *migration) leaving(x *exchange, now time.Time) bool {
	if now.Sub(m.checkedAt) < leaveCheck {
		return false
	}
	m.checkedAt = now
	rep := x.last
	gone := rep.Draining() || !slices.Contains(x.route.Pool.Replicas(), rep)
	switch {
	case !gone:
		m.leavingSince = time.Time{}
	case m.leavingSince.IsZero():
		m.leavingSince = now
	}
	return gone && now.Sub(m.leavingSince) >= m.pol.DrainGrace
}

// leaveCheck is how often a stream looks at whether its replica is
// leaving: well below any sensible grace period, and a pool scan per
// stream at most four times a second.
const leaveCheck = 250 * time.Millisecond

// closedBody stands for an upstream stream already let go.
type closedBody struct{}

func (closedBody) Read([]byte) (int, error)   { return 0, io.EOF }
func (closedBody) CloseWithError(error) error { return nil }
