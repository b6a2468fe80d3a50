package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unsafe"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// retryable reports an upstream status that says "not now, try elsewhere"
// before the engine started on the request: a 502 from a proxy in front of
// the engine. (429 and 503 are refusals: see forward.)
func retryable(status int) bool { return status == fasthttp.StatusBadGateway }

// pickRequest is what the picker reads about the request.
func (x *exchange) pickRequest() balancer.Request {
	r := balancer.Request{
		AffinityKey: x.affinity,
		PrefixHash:  x.req.prefixHash,
		ArmKey:      x.id,
		Arm:         x.arm,
		// When it is placed, not when it arrived: a request that waited
		// in the admission queue must be judged by the replicas' state now.
		Now: x.received,
		// A long prompt must not queue behind another on one replica.
		LongPrefillCap: x.ticket.LongPrefillCap(),
		PromptTokens:   x.cost.PromptTokens,
		OutputTokens:   x.cost.OutputTokens,
		Room:           x.ticket.Room(),
	}
	if !x.admitted.IsZero() {
		r.Now = x.admitted
	}
	if x.req.user != "" {
		r.ArmKey = x.req.user // a user stays in one arm across requests
	}
	return r
}

// noReplica is the error for a request that found no replica to try:
// why the last one tried failed — said of the whole pool when every
// replica is unreachable — else that every replica is resting after
// refusals, else that none is available.
func (x *exchange) noReplica(lastErr error) error {
	p := x.route.Pool
	now := x.s.now()
	switch {
	case errors.Is(lastErr, errUnreachable) && p.Available(now) == 0:
		return fmt.Errorf("%w: every replica of model %q is unreachable (last: %s)", ErrNoReplica, p.Model(), lastErr.(*upstreamFailure).words)
	case lastErr != nil:
		return lastErr
	}
	if until, ok := p.RestEnds(now); ok {
		return &refusal{model: p.Model(), status: fasthttp.StatusTooManyRequests, retryAfter: until.Sub(now)}
	}
	return fmt.Errorf("%w for model %q", ErrNoReplica, p.Model())
}

// retryWait is the pause before the next try: none while no attempt has
// gone out, full-jitter backoff after one. It returns the error that ends
// the request instead: attempts used up, or the total deadline passed.
func (s *Server) retryWait(x *exchange, pick *balancer.Request, lastErr error) error {
	d, err := s.retryDelay(x, lastErr)
	if err != nil || d == 0 {
		return err
	}
	s.sleep(d)
	return s.retryAfterWait(x, pick, lastErr)
}

// retryDelay is retryWait's decision: the pause, or the error that ends
// the request.
func (s *Server) retryDelay(x *exchange, lastErr error) (time.Duration, error) {
	if x.attempts >= s.cfg.MaxAttempts {
		return 0, x.noReplica(lastErr)
	}
	if x.attempts > 0 {
		return s.backoff(x.attempts), nil
	}
	return 0, nil
}

// retryAfterWait is the check after a retry's pause: the total deadline,
// and the replicas' state judged anew.
func (s *Server) retryAfterWait(x *exchange, pick *balancer.Request, lastErr error) error {
	now := s.now()
	if s.exceededAt(x, now) {
		return fmt.Errorf("%w: total deadline passed while retrying (%v)", ErrTimeout, lastErr)
	}
	pick.Now = now
	return nil
}

// forward sends the request to rep, watching the client until the engine
// answers. It returns the response to relay (the exchange then holds the
// replica's lease); or again with the reason rep can't take it — nil when
// nothing was sent — when another replica may be tried, which is possible
// only because nothing has reached the client yet: a connection failure,
// a 502/503/429 before the last attempt, an open breaker; or the error
// that ends the request (the client left, the deadline passed).
func (s *Server) forward(rt *routeTable, x *exchange, rep *balancer.Replica, ureq *fasthttp.Request, w *clientWatch) (resp *fasthttp.Response, again bool, err error) {
	up, lease, err := s.beginAttempt(rt, x, rep)
	if up == nil {
		return nil, true, err
	}
	resp = fasthttp.AcquireResponse()
	resp.StreamBody = true
	ureq.Header.SetHost(rep.Addr())
	x.sent = s.now()
	// Until the engine answers — a whole non-streamed generation, a long
	// prefill — only the watch notices a client that leaves (or the total
	// deadline, or a drain's end) and aborts the request.
	pr := up.pending.expect(x.seq, x.req.stream)
	w.retarget(pr)
	err = up.client.Do(ureq, resp)
	w.retarget(nil)
	if cause := up.pending.settle(x.seq, pr); cause != nil {
		if err == nil {
			resp.CloseBodyStream() //nolint:errcheck
		}
		fasthttp.ReleaseResponse(resp)
		abandon(lease, cause)
		return nil, false, cause
	}
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, true, s.attemptFailed(x, rep, lease, err)
	}
	if err := s.judge(x, rep, lease, resp); err != nil {
		resp.CloseBodyStream() //nolint:errcheck
		fasthttp.ReleaseResponse(resp)
		return nil, true, err
	}
	x.answered(up, lease)
	x.upc = nil
	if pr.dconn != nil && pr.dconn.headCut {
		x.upc = pr.dconn
	}
	return resp, false, nil
}

// beginAttempt is an attempt's start on rep: its upstream, and a lease
// with the request's cost. A nil upstream means rep can't take it, with
// the reason (nil when nothing stands against another replica): not an
// attempt, as nothing was sent.
func (s *Server) beginAttempt(rt *routeTable, x *exchange, rep *balancer.Replica) (*upstream, balancer.Lease, error) {
	up := s.upstreamOf(rt, rep)
	if up == nil {
		// A reload put the replica in its pool and has not yet published
		// the table that connects to it: not routable yet.
		return nil, balancer.Lease{}, nil
	}
	work, kv, long := x.leaseCost()
	lease, err := rep.AcquireRequest(balancer.LeaseCost{Work: work, KV: kv, Long: long, PromptTokens: int64(x.cost.PromptTokens),
		OutputTokens: int64(max(x.cost.OutputTokens, 0)), TPOTObjective: x.cost.TPOT})
	if err != nil {
		// An open breaker: nothing was sent.
		return nil, balancer.Lease{}, fmt.Errorf("%w for model %q (breakers open)", ErrNoReplica, x.route.Pool.Model())
	}
	x.attempts++
	x.last = rep
	x.ticket.Placed()
	return up, lease, nil
}

// abandon ends the lease of an attempt given up for cause — the client
// left, the deadline passed, the router shuts down: only a timeout is the
// replica's fault.
func abandon(lease balancer.Lease, cause error) {
	if errors.Is(cause, ErrTimeout) {
		lease.Done(cause)
		return
	}
	lease.Done(errors.Join(cause, balancer.ErrNotReplicaFault))
}

// attemptFailed judges err, which ended the attempt on rep before any
// response byte: the error to try another replica with.
func (s *Server) attemptFailed(x *exchange, rep *balancer.Replica, lease balancer.Lease, err error) error {
	err = upstreamError(rep, err)
	if errors.Is(err, errUnreachable) {
		// Nothing listens there: the request was never processed, so
		// it is no attempt, and the replica is down until the health
		// checker sees it again — not a breaker failure, a fact.
		x.attempts--
		lease.Done(balancer.ErrNotReplicaFault)
		if rep.MarkDown() {
			s.log.Warn("replica unreachable: out of rotation until its health check passes",
				zap.String("replica", rep.Name()), zap.Error(err.(*upstreamFailure).cause))
		}
	} else {
		lease.Done(err)
	}
	s.m.retries.WithLabelValues(x.route.Pool.Model(), retryReason(err)).Inc()
	return err
}

// judge reads the status of rep's response: nil when it is the answer to
// relay, else the reason to try another replica (the lease is then done,
// the caller closes the response).
func (s *Server) judge(x *exchange, rep *balancer.Replica, lease balancer.Lease, resp *fasthttp.Response) error {
	status := resp.StatusCode()
	if passesOnStatus(status) {
		return nil
	}
	if status == fasthttp.StatusTooManyRequests || status == fasthttp.StatusServiceUnavailable {
		// The engine has no room (its queue is full): it rests for its
		// Retry-After and the request goes to a replica that has room, or
		// back to the client as the same refusal. Not the breaker's
		// business: the replica is working, just full.
		now := s.now()
		ra := retryAfterOf(resp, now)
		rep.Rest(now, now.Add(ra))
		lease.Done(balancer.ErrNotReplicaFault)
		s.m.retries.WithLabelValues(x.route.Pool.Model(), strconv.Itoa(status)).Inc()
		return &refusal{replica: rep.Name(), model: x.route.Pool.Model(), status: status, retryAfter: ra}
	}
	if retryable(status) && x.attempts < s.cfg.MaxAttempts {
		lease.Done(fmt.Errorf("upstream status %d", status))
		s.m.retries.WithLabelValues(x.route.Pool.Model(), strconv.Itoa(status)).Inc()
		return fmt.Errorf("%w: replica %s answered %d", ErrUpstream, rep.Name(), status)
	}
	return nil
}

// passesOnStatus reports whether judge passes an answer of this status
// whatever else it holds: a request loop relays those without the
// Response judge reads (reqloop_answer_linux.go).
func passesOnStatus(status int) bool {
	return status != fasthttp.StatusTooManyRequests && status != fasthttp.StatusServiceUnavailable && !retryable(status)
}

// answered makes the exchange the holder of the attempt that answered:
// its replica's metrics and lease, and the time its head came.
func (x *exchange) answered(up *upstream, lease balancer.Lease) {
	x.up, x.rm, x.lease, x.firstByte = up, up.metricsFor(x.arm), lease, x.s.now()
}

// upstreamOf is rep's upstream: from rt, the table the request was routed
// with, or for a replica added to its pool since, from the current table.
// Pools are updated in place on reload, so a request can pick a replica
// newer than its table; nil until the table that has it is published.
func (s *Server) upstreamOf(rt *routeTable, rep *balancer.Replica) *upstream {
	if u, ok := rt.upstream(rep); ok {
		return u
	}
	u, _ := s.routes.Load().upstream(rep)
	return u
}

func retryReason(err error) string {
	if errors.Is(err, ErrTimeout) {
		return "timeout"
	}
	return "connect"
}

// backoff is full-jitter exponential: uniform in [0, min(max, base·2^n)).
func (s *Server) backoff(attempt int) time.Duration {
	d := s.cfg.BackoffBase << (attempt - 1)
	if d > s.cfg.BackoffMax || d <= 0 {
		d = s.cfg.BackoffMax
	}
	return time.Duration(s.jitter(int64(d)) + 1)
}

func isEventStream(resp *fasthttp.Response) bool {
	return bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream"))
}

// copyHeaders copies the upstream response headers the client should see.
func copyHeaders(ctx *fasthttp.RequestCtx, resp *fasthttp.Response, x *exchange) {
	resp.Header.VisitAll(func(k, v []byte) {
		if droppedAnswerHeader(k) {
			return
		}
		ctx.Response.Header.SetBytesKV(k, v)
	})
	setOwnHeader(&ctx.Response.Header, "X-Request-Id", x.id)
	ctx.Response.Header.Set("X-Gpurouter-Replica", x.up.replica.Name())
}

// droppedAnswerHeader reports whether an engine's response header is one
// the client does not get from it: hop-by-hop, or one the router's server
// writes itself.
func droppedAnswerHeader(k []byte) bool {
	return isHopByHop(k) || bytes.EqualFold(k, []byte("Content-Length")) || bytes.EqualFold(k, []byte("Server")) ||
		bytes.EqualFold(k, []byte("Date"))
}

// setOwnHeader sets one of the router's own response headers, its name
// given as fasthttp normalizes it: Set would normalize a copy of the name
// on every request. Both are copied in; value must hold no line break
// (Set would have replaced them).
func setOwnHeader(h *fasthttp.ResponseHeader, canonical, value string) {
	h.SetCanonical(unsafe.Slice(unsafe.StringData(canonical), len(canonical)), unsafe.Slice(unsafe.StringData(value), len(value)))
}

// startStream commits the 200 and hands the upstream stream to a relay,
// which runs once the handler returns: on the connection itself
// (hijack.go), or as the body fasthttp writes.
func (s *Server) startStream(ctx *fasthttp.RequestCtx, x *exchange, resp *fasthttp.Response, strip bool, w *clientWatch) {
	copyHeaders(ctx, resp, x)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.ImmediateHeaderFlush = true
	body := resp.BodyStream().(fasthttp.ReadCloserWithError)
	hj := hijackable(ctx)
	if hj && !s.cfg.GoroutineStreams && ctx.Request.Header.IsHTTP11() {
		// Relayed in the stream loop where it can be (pump_linux.go),
		// which writes chunked framing: HTTP/1.1's.
		if b := s.pump().detach(x, resp, ctx.Conn()); b != nil {
			// The head is copied and the body taken: nothing of the
			// response is needed for the rest of the stream.
			fasthttp.ReleaseResponse(resp)
			body, resp = b, nil
		}
	}
	x.upc = nil
	r := newRelay(x, resp, body, strip)
	r.watch = w
	if c, ok := ctx.Conn().(*prefetchConn); ok { // our listener's; an embedder's server keeps its own write limits
		r.conn = c // the hijacked one replaces it (hijack.go)
	}
	w.retarget(r)
	releaseClientBody(ctx, x)
	if hj {
		s.hijackStream(ctx, r) // hijack.go
		return
	}
	ctx.Response.SetBodyStream(r, -1)
}

// releaseClientBody gives the client's request body back to fasthttp's pool
// once a stream has started: the engine has it, and holding it for the
// whole generation would cost a stream its prompt's size (a 32k-token
// prompt is ~100 KiB). A migration that resends the body as the client
// sent it keeps it; one that asked for token ids resends its own copy.
// Every string kept from the body was cloned (see bytesView).
func releaseClientBody(ctx *fasthttp.RequestCtx, x *exchange) {
	if m := x.mig; m != nil && sameBacking(m.body, ctx.Request.Body()) {
		return
	}
	ctx.Request.ResetBody()
}

// readAtMost reads r to its end into buf, stopping once buf holds limit
// bytes (the caller's sign that the body is too long). io.LimitReader's
// reader would be one allocation a response more.
func readAtMost(buf *bytebufferpool.ByteBuffer, r io.Reader, limit int) error {
	for len(buf.B) < limit {
		if len(buf.B) == cap(buf.B) {
			buf.B = append(buf.B, 0)[:len(buf.B)]
		}
		n, err := r.Read(buf.B[len(buf.B):min(cap(buf.B), limit)])
		buf.B = buf.B[:len(buf.B)+n]
		switch {
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
	return nil
}

// sameBacking reports whether a and b are slices of one array (both
// reaching its end, as a body and its prefixes or suffixes do).
func sameBacking(a, b []byte) bool {
	return cap(a) > 0 && cap(b) > 0 && &a[:cap(a)][cap(a)-1] == &b[:cap(b)][cap(b)-1]
}

// respondWhole reads a non-streamed response (bounded, watched for client
// disconnect) and passes it on (wholeBody: the exchange finishes once it
// is written); a 200 that is not JSON is a broken upstream.
func (s *Server) respondWhole(ctx *fasthttp.RequestCtx, x *exchange, resp *fasthttp.Response, w *clientWatch) {
	defer w.stop()
	stream, _ := resp.BodyStream().(fasthttp.ReadCloserWithError)
	buf := bytebufferpool.Get()
	var err error
	if stream != nil {
		w.retarget(abortFunc(func(e error) { stream.CloseWithError(e) }))
		err = readAtMost(buf, stream, s.cfg.MaxResponseBytes+1)
		w.stop()
		if err == nil && buf.Len() > s.cfg.MaxResponseBytes {
			err = fmt.Errorf("%w: response over %d bytes", ErrUpstream, s.cfg.MaxResponseBytes)
		}
		stream.CloseWithError(err)
	} else {
		buf.Set(resp.Body())
	}
	status := resp.StatusCode()
	var members objectMembers // a 200's, where its usage is
	if err == nil {
		err = checkWhole(x, status, buf.B, &members)
	}
	if err != nil {
		bytebufferpool.Put(buf)
		fasthttp.ReleaseResponse(resp)
		switch {
		case isTimeout(err):
			err = &upstreamFailure{kind: ErrTimeout, words: "replica " + x.up.replica.Name() + " stopped sending its response", cause: err}
		case !errors.Is(err, ErrUpstream) && !errors.Is(err, ErrClientGone):
			err = &upstreamFailure{kind: ErrUpstream, words: "replica " + x.up.replica.Name() + ": " + streamWords(err) + " during the response", cause: err}
		}
		s.reject(ctx, x, err)
		return
	}
	copyHeaders(ctx, resp, x)
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	fasthttp.ReleaseResponse(resp)
	ctx.SetStatusCode(status)
	// The answer goes out first; its usage, metrics and log line follow
	// (wholeBody.CloseWithError): step 7, off the client's wait.
	wb := &wholeBody{x: x, buf: buf, status: status}
	if status == fasthttp.StatusOK {
		wb.setUsage(members.member(buf.B, "usage"))
	}
	ctx.SetBodyStream(wb, buf.Len())
}

// checkWhole is a whole answer's check before it goes to the client: a
// 200 must be JSON (members notes its top level, where its usage is).
// The error is ErrUpstream's, for reject.
func checkWhole(x *exchange, status int, body []byte, members *objectMembers) error {
	if status == fasthttp.StatusOK && checkJSONMembers(body, members) != nil {
		return fmt.Errorf("%w: %s returned a malformed JSON body", ErrUpstream, x.up.replica.Name())
	}
	return nil
}
