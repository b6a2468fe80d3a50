package proxy

import (
	"errors"
	"fmt"
	"net"

	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/fasthttp"
)

// handle dispatches by path: the OpenAI API goes through proxyAPI, the
// router's own endpoints are answered here.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	// A view of fasthttp's buffer, valid for the handler's life: what
	// outlives it (an error's text) is copied by fmt.
	path := openai.BytesView(requestPath(ctx))
	switch path {
	case "/health":
		ctx.SetStatusCode(fasthttp.StatusOK)
		return
	case "/ready":
		s.serveReady(ctx)
		return
	case "/metrics":
		s.serveMetrics(ctx)
		return
	case "/v1/models":
		if !ctx.IsGet() {
			writeError(ctx, fmt.Errorf("%w: %s %s", ErrMethodNotAllowed, ctx.Method(), path))
			return
		}
		s.serveModelsAuth(ctx)
		return
	case "/debug/requests":
		s.serveDebugRequests(ctx)
		return
	case "/debug/pools":
		s.serveDebugPools(ctx)
		return
	case "/debug/latency":
		s.serveDebugLatency(ctx)
		return
	case "/status", "/":
		s.serveStatus(ctx)
		return
	}
	rt := s.routes.Load()
	ep, prefixRoute := rt.apiRoute(path)
	switch {
	case ep == 0:
		writeError(ctx, fmt.Errorf("%w: no route for %s", ErrNotFound, path))
	case !ctx.IsPost():
		ctx.Response.Header.Set("Allow", "POST")
		writeError(ctx, fmt.Errorf("%w: %s %s (use POST)", ErrMethodNotAllowed, ctx.Method(), path))
	default:
		s.proxyAPI(ctx, rt, ep, prefixRoute)
	}
}

// proxyAPI serves one API request on fasthttp's goroutine: it does what
// the request's flow asks (flow.go, which reads top to bottom), each act
// at once — the admission wait, the engine's request, a retry's pause,
// the relay's start — and returns with the answer on ctx for fasthttp to
// write, or a stream's relay started. Everything the request acquires is
// released in exchange.finish (step 7), called exactly once: when the
// answer is written (relay.CloseWithError for a stream,
// wholeBody.CloseWithError for a whole answer, fasthttp's write for the
// rest).
//
// On Linux a request loop drives the same flow without a goroutine
// (reqloop_exchange_linux.go); what it does not serve comes here.
func (s *Server) proxyAPI(ctx *fasthttp.RequestCtx, rt *routeTable, ep openai.Endpoint, prefix *poolRoute) {
	f := s.flows.Get().(*flow)
	*f = flow{s: s, ctx: ctx, rt: rt}
	a := f.begin(ep, prefix)
	if a == actAdmit {
		a = f.admitted(s.admitWatched(ctx, f.x))
	}
	// One watch over the client from the first attempt to the end of the
	// answer (watch.go): each attempt, then the relay, takes it over.
	var w *clientWatch
	resp, a := s.attempts(f, a, &w, ctx.Conn())
	switch a {
	case actStream:
		s.startStream(f, resp, w)
	case actWhole:
		s.respondWhole(f, resp, w)
	default:
		w.stop()
	}
	*f = flow{}
	s.flows.Put(f)
}

// attempts does a flow's steps 4–5 on the goroutine path, from a (its
// next act) until the engine answers (the response, for actStream or
// actWhole) or the request ends: each attempt sent and awaited, each
// pause slept. *w is the client watch, started on the first attempt over
// client; nil while none was sent.
func (s *Server) attempts(f *flow, a act, w **clientWatch, client net.Conn) (*fasthttp.Response, act) {
	var ureq *fasthttp.Request
	defer func() {
		if ureq != nil {
			fasthttp.ReleaseRequest(ureq)
		}
	}()
	for {
		switch a {
		case actSend:
			if ureq != nil && !sameBody(ureq.Body(), f.body) {
				fasthttp.ReleaseRequest(ureq) // a split's decode step gave up its KV (disagg.go)
				ureq = nil
			}
			if ureq == nil {
				ureq = s.upstreamRequest(f.ctx, f.x, f.body)
				if *w == nil { // a split request's prefill started it
					*w = s.startWatch(f.x, client, nil)
				}
			}
			var resp *fasthttp.Response
			if resp, a = s.send(f, ureq, *w); resp != nil {
				return resp, a
			}
		case actPause:
			s.sleep(f.delay)
			a = f.resume()
		case actLoad:
			a = f.loaded(s.loadAdapter(f, w, client))
		case actPrefillAdmit:
			a = f.prefillAdmitted(s.prefillAdmitWatched(f, client))
		case actPrefill:
			if *w == nil {
				*w = s.startWatch(f.x, client, nil)
			}
			a = s.sendPrefill(f, *w)
		default:
			return nil, a
		}
	}
}

// send is actSend on the goroutine path: the request to the flow's
// replica, watching the client (w) until the engine answers — a whole
// non-streamed generation, a long prefill: only the watch notices a
// client that leaves, or the total deadline, or a drain's end, and it
// aborts the request. It returns the answer with its act (actStream or
// actWhole), else no response and what the flow makes of the attempt.
func (s *Server) send(f *flow, ureq *fasthttp.Request, w *clientWatch) (*fasthttp.Response, act) {
	x := f.x
	resp := fasthttp.AcquireResponse()
	pr, cause, err := s.do(f, ureq, resp, w, x.req.Stream)
	if cause != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, f.abandon(cause)
	}
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, f.failed(err)
	}
	a := f.answered(resp)
	if a != actStream && a != actWhole {
		resp.CloseBodyStream() //nolint:errcheck
		fasthttp.ReleaseResponse(resp)
		return nil, a
	}
	x.upc = nil
	if pr.dconn != nil && pr.dconn.headCut {
		x.upc = pr.dconn
	}
	return resp, a
}

// do is one request to the flow's replica on the goroutine path: ureq
// sent and resp's head read (its body streamed), the client watched by w
// meanwhile (stream: the answer is an event stream). cause is why the
// watch ended it (resp's body then closed), else err is fasthttp's; pr is
// the request as the replica's pending set had it.
func (s *Server) do(f *flow, ureq *fasthttp.Request, resp *fasthttp.Response, w *clientWatch, stream bool) (pr *pendingReq, cause, err error) {
	x, up := f.x, f.up
	resp.StreamBody = true
	ureq.Header.SetHost(f.rep.Addr())
	x.tr.Inject(&ureq.Header) // the attempt's span, the engine's parent
	pr = up.pending.expect(x.seq, stream)
	pr.timed = x.tr.Recording()
	w.retarget(pr)
	err = up.client.Do(ureq, resp)
	w.retarget(nil)
	if pr.timed && pr.dconn != nil {
		x.tr.AttemptConnected(pr.dconn.wroteAt)
	}
	if cause = up.pending.settle(x.seq, pr); cause != nil && err == nil {
		resp.CloseBodyStream() //nolint:errcheck
	}
	return pr, cause, err
}

// reject answers with err's status and OpenAI error body and finishes the
// exchange.
func (s *Server) reject(ctx *fasthttp.RequestCtx, x *exchange, err error) {
	writeError(ctx, err)
	setOwnHeader(&ctx.Response.Header, "X-Request-Id", x.id)
	if x.last != nil {
		ctx.Response.Header.Set("X-Gpurouter-Replica", x.last.Name())
	}
	x.finish(err, statusOf(err))
}

// handleParseError answers requests fasthttp could not read (a body over
// the limit, a client too slow to send its body) with an OpenAI error;
// fasthttp then closes the connection. Malformed heads never reach
// fasthttp: the front door refuses them (frontdoor.go); the other cases
// stay for a head the grammar took and fasthttp did not.
func (s *Server) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	timeout := errors.As(err, &ne) && ne.Timeout()
	if pc, ok := ctx.Conn().(*prefetchConn); ok && !timeout {
		// The client may still be sending what was refused: without a
		// lingering close its kernel may drop the answer (linger.go). A
		// client too slow to send is not waited on any longer.
		pc.lingerOnClose()
	}
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fmt.Errorf("%w: limit is %d bytes", ErrBodyTooLarge, s.cfg.MaxBodyBytes))
	case errors.As(err, &small):
		writeError(ctx, fmt.Errorf("%w: request line and headers are limited to %d bytes", ErrHeaderTooLarge, s.cfg.MaxHeaderBytes))
	case timeout:
		writeError(ctx, s.to.requestLate())
	default:
		writeError(ctx, fmt.Errorf("%w: %v", openai.ErrBadRequest, err))
	}
}
