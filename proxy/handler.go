package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/fasthttp"
)

// handle dispatches by path: the OpenAI API goes through proxyAPI, the
// router's own endpoints are answered here.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	// A view of fasthttp's buffer, valid for the handler's life: what
	// outlives it (an error's text) is copied by fmt.
	path := bytesView(requestPath(ctx))
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

// proxyAPI is one API request, top to bottom; the steps are DESIGN.md's.
// Everything it acquires is released in exchange.finish (step 7), called
// exactly once: here for requests that end before a response starts,
// else when fasthttp has written it (relay.CloseWithError for a stream,
// wholeBody.CloseWithError for a whole answer).
//
// On Linux a whole (non-streamed) request usually takes these steps in a
// request loop instead (reqloop_exchange_linux.go: start, place, answer),
// through the same functions, without a goroutine; everything else —
// streams, the router's own endpoints — comes here.
func (s *Server) proxyAPI(ctx *fasthttp.RequestCtx, rt *routeTable, ep endpoint, prefixRoute *poolRoute) {
	hdr := readClientHeaders(&ctx.Request.Header)
	x := s.newExchange(ctx, ep, hdr.requestID)
	if s.draining.Load() {
		s.reject(ctx, x, ErrShuttingDown)
		return
	}

	// 1. Read the request: the client's API key first, when keys are
	// configured (a client without one learns nothing, not even which
	// models exist), then the body, parsed once (request.go).
	if err := s.authenticate(hdr.authorization, x); err != nil {
		s.reject(ctx, x, err)
		return
	}
	body := ctx.PostBody()
	var err error
	if x.req, err = s.readBody(body, ep); err != nil {
		s.reject(ctx, x, err)
		return
	}

	// 2. Find the pool and the request's cost; the key's model and rate
	// limits (plan).
	body, strip, err := s.plan(ctx, &hdr, x, rt, prefixRoute, body)
	if err != nil {
		s.reject(ctx, x, err)
		return
	}

	// 3. Admission: while the pool is saturated the request waits here,
	// shortest expected work first (with aging), instead of in an engine's
	// queue; it is shed with 429 + Retry-After when it can't be served in
	// time (admit.go).
	if err := s.admit(ctx, x); err != nil {
		s.reject(ctx, x, err)
		return
	}

	// 4–5. Pick a replica (the pool's policy) and forward to it; before
	// any byte has reached the client, a connection failure or a
	// 502/503/429 picks another, up to MaxAttempts (forward.go).
	pick := x.pickRequest()
	if err := sloOf(&hdr, &pick); err != nil {
		s.reject(ctx, x, err)
		return
	}
	ureq := s.upstreamRequest(ctx, x, ep, body)
	// One watch over the client from the first attempt to the end of the
	// response (watch.go): each attempt, then the relay, takes it over.
	w := s.startWatch(x, ctx.Conn(), nil)
	var triedArr [8]*balancer.Replica
	tried := triedArr[:0]
	var resp *fasthttp.Response
	var lastErr error // why the last replica tried did not answer
	for {
		rep := x.route.Pool.PickExcept(&pick, tried) // 4.
		x.arm = pick.Arm
		if rep == nil {
			err = x.noReplica(lastErr)
			break
		}
		tried = append(tried, rep)
		var again bool
		if resp, again, err = s.forward(rt, x, rep, ureq, w); !again { // 5.
			break
		}
		if err != nil {
			lastErr = err
		}
		if err = s.retryWait(x, &pick, lastErr); err != nil {
			break
		}
	}
	fasthttp.ReleaseRequest(ureq)
	x.placed()
	if err != nil {
		w.stop()
		s.reject(ctx, x, err)
		return
	}

	// 6. Relay: SSE event by event, or the whole body. Step 7 follows
	// when the response is written: exchange.finish.
	if resp.StatusCode() == fasthttp.StatusOK && isEventStream(resp) {
		s.startStream(ctx, x, resp, strip, w)
		return
	}
	s.respondWhole(ctx, x, resp, w)
}

// newExchange begins an API request's exchange, with the client's
// X-Request-Id (nil: a new one): from here on it is counted (Active) and
// must be finished exactly once.
func (s *Server) newExchange(ctx *fasthttp.RequestCtx, ep endpoint, id []byte) *exchange {
	x := &exchange{s: s, ep: ep, received: s.now()}
	s.active.Add(1)
	x.id = string(id)
	if bytes.ContainsAny(id, "\r\n") {
		// A line break in a header the router writes back would split it
		// (setOwnHeader writes the id as it is).
		x.id = strings.NewReplacer("\r", " ", "\n", " ").Replace(x.id)
	}
	if x.id == "" {
		x.id = s.ids()
	}
	setOwnHeader(&ctx.Response.Header, "X-Request-Id", x.id)
	return x
}

// readBody parses an API request's body (request.go). It has no side
// effect: the request loop reads a body before deciding which path serves
// it (reqloop_linux.go).
func (s *Server) readBody(body []byte, ep endpoint) (request, error) {
	p := s.parsers.Get()
	req, err := readRequest(p, body, ep)
	s.parsers.Put(p)
	return req, err
}

// plan is step 2: the pool — the path prefix's, else the body's model —
// and with it the request's one cost: the pool's output cap first (a
// request asking for more, or not saying, is clamped and told so), then
// the pool's estimate. The key's model and rate limits, and the admission
// headers, complete it (clients.go, admit.go). It returns the body to
// send, and whether the usage chunk the router asks a stream's engine for
// must be hidden from the client.
func (s *Server) plan(ctx *fasthttp.RequestCtx, hdr *clientHeaders, x *exchange, rt *routeTable, prefixRoute *poolRoute, body []byte) ([]byte, bool, error) {
	x.arm = string(hdr.policy)
	x.affinity = string(hdr.session)
	if x.affinity == "" {
		x.affinity = x.req.user
	}
	var err error
	x.route, err = s.routeFor(rt, x.req.model, prefixRoute)
	if err != nil {
		return nil, false, err
	}
	ep := x.ep
	if limit := x.route.MaxTokens; limit > 0 && ep != epEmbeddings {
		var clamped bool
		if body, clamped, err = x.req.clampOutput(body, limit); err != nil {
			return nil, false, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		if clamped {
			ctx.Response.Header.Set(headerMaxTokens, strconv.Itoa(limit))
		}
	}
	x.cost = x.route.costOf(&x.req, ep)
	if err := s.permit(x); err != nil {
		return nil, false, err
	}
	if err := s.steer(hdr, x); err != nil {
		return nil, false, err
	}
	// The router needs exact token counts: ask the engine for the usage
	// chunk, and hide it again if the client did not ask for it.
	if x.req.stream && !x.req.clientUsage && ep != epEmbeddings {
		if body, err = withIncludeUsage(body, &x.req); err != nil {
			return nil, false, fmt.Errorf("%w: %v", ErrBadRequest, err)
		}
		return body, true, nil
	}
	return body, false, nil
}

// placed records the request's queue time — from its arrival to its
// admission or, without admission, to its last attempt — once its
// attempts are over.
func (x *exchange) placed() {
	if a := x.admittedAt(); !a.IsZero() {
		x.route.queue.Observe(a.Sub(x.received).Seconds())
		x.recordQueue(a)
	}
}

// routeFor resolves the pool for a request: its path prefix's, else the
// one its model names (or the only one, when it names none, as vLLM serves
// its one model).
func (s *Server) routeFor(rt *routeTable, model string, prefix *poolRoute) (*poolRoute, error) {
	if prefix != nil {
		return prefix, nil
	}
	if model == "" {
		if len(rt.routes) == 1 {
			return rt.routes[0], nil
		}
		return nil, badParam("model", fmt.Sprintf("required; available models: %s", availableModels(rt)))
	}
	if r, ok := rt.byModel[model]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("%w: the model %q does not exist; available models: %s", ErrUnknownModel, model, availableModels(rt))
}

// costOf is a request's cost on this route, worked out once: the pool's
// estimator corrects the prompt's raw size and fills in the expected
// output when max_tokens is not given; embeddings generate nothing.
func (r *poolRoute) costOf(req *request, ep endpoint) admission.Cost {
	if ep == epEmbeddings {
		return r.est.PromptCost(req.promptTokens())
	}
	return r.est.Cost(req.promptTokens(), req.maxTokens)
}

func availableModels(rt *routeTable) string {
	out := ""
	for _, p := range rt.pools {
		for _, n := range append([]string{p.Model()}, p.Aliases()...) {
			if out != "" {
				out += ", "
			}
			out += n
		}
	}
	return out
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

// headerMaxTokens tells the client its max_tokens was clamped, and to what.
const headerMaxTokens = "X-Gpurouter-Max-Tokens"

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
		writeError(ctx, fmt.Errorf("%w: the request must arrive within %s", ErrRequestTimeout, s.cfg.ReadTimeout))
	default:
		writeError(ctx, fmt.Errorf("%w: %v", ErrBadRequest, err))
	}
}
