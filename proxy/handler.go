package proxy

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/fasthttp"
)

// handle dispatches by path: the OpenAI API goes through proxyAPI, the
// router's own endpoints are answered here.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
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
	}
	rt := s.routes.Load()
	ep, prefixPool := rt.apiRoute(path)
	switch {
	case ep == 0:
		writeError(ctx, fmt.Errorf("%w: no route for %s", ErrNotFound, path))
	case !ctx.IsPost():
		ctx.Response.Header.Set("Allow", "POST")
		writeError(ctx, fmt.Errorf("%w: %s %s (use POST)", ErrMethodNotAllowed, ctx.Method(), path))
	default:
		s.proxyAPI(ctx, rt, ep, prefixPool)
	}
}

// proxyAPI is one API request, top to bottom. Everything it acquires is
// released in exchange.finish, called exactly once: here for requests that
// end before a response stream starts, in relay.CloseWithError otherwise.
func (s *Server) proxyAPI(ctx *fasthttp.RequestCtx, rt *routeTable, ep endpoint, prefixPool *balancer.Pool) {
	x := &exchange{s: s, ep: ep, received: s.now()}
	s.active.Add(1)
	x.id = string(ctx.Request.Header.Peek("X-Request-Id"))
	if x.id == "" {
		x.id = s.ids()
	}
	ctx.Response.Header.Set("X-Request-Id", x.id)
	if s.draining.Load() {
		s.reject(ctx, x, ErrShuttingDown)
		return
	}

	// 0. Clients: with API keys configured, a valid one comes first
	// (clients.go).
	if err := s.authenticate(ctx, x); err != nil {
		s.reject(ctx, x, err)
		return
	}

	// 1. Parse the body once: model, stream, max_tokens, prompt size, user.
	body := ctx.PostBody()
	req, err := parseRequest(body, ep)
	if err != nil {
		s.reject(ctx, x, err)
		return
	}
	x.req = req
	x.arm = string(ctx.Request.Header.Peek("X-Gpurouter-Policy"))
	x.affinity = string(ctx.Request.Header.Peek("X-Session-Id"))
	if x.affinity == "" {
		x.affinity = req.user
	}
	x.prefillCost, x.outputCost = s.costOf(&req)
	x.estPrompt = req.promptTokens()
	x.tenant = req.user

	// 2. Find the pool: the path prefix's, else the body's model.
	x.pool, err = s.poolFor(rt, req.model, prefixPool)
	if err != nil {
		s.reject(ctx, x, err)
		return
	}

	// The pool's output cap: a request asking for more (or not saying)
	// is clamped to it, and told so in a response header.
	if limit := s.maxTokensOf(x.pool); limit > 0 && ep != epEmbeddings {
		if body, err = withMaxTokens(body, limit); err != nil {
			s.reject(ctx, x, fmt.Errorf("%w: %w", ErrBadRequest, err))
			return
		}
		if req.maxTokens == 0 || req.maxTokens > limit {
			req.maxTokens, x.req.maxTokens = limit, limit
			x.prefillCost, x.outputCost = s.costOf(&req)
			ctx.Response.Header.Set(headerMaxTokens, strconv.Itoa(limit))
		}
	}

	// 2a. The client's API key must allow the pool's model and be within
	// its rate limits.
	if err := s.permit(x); err != nil {
		s.reject(ctx, x, err)
		return
	}

	// The router needs exact token counts: ask the engine for the usage
	// chunk, and hide it again if the client did not ask for it.
	strip := false
	if req.stream && !req.clientUsage && ep != epEmbeddings {
		if body, err = withIncludeUsage(body, req.hasOptions); err != nil {
			s.reject(ctx, x, fmt.Errorf("%w: %v", ErrBadRequest, err))
			return
		}
		strip = true
	}

	// 3. Admission: while the pool is saturated the request waits here,
	// shortest expected work first (with aging), instead of in an engine's
	// queue; it is shed with 429 + Retry-After when it can't be served in time.
	if pa, ok := rt.admit[x.pool]; ok {
		// With no replica up the pool can't serve it however long it
		// waits: 503 now, as without admission, not a queue until one
		// comes back.
		if x.pool.Available(x.received) == 0 {
			s.reject(ctx, x, fmt.Errorf("%w for model %q", ErrNoReplica, x.pool.Model()))
			return
		}
		if err := s.admit(ctx, x, pa); err != nil {
			s.reject(ctx, x, err)
			return
		}
	}

	// 4–5. Pick a replica and forward, retrying elsewhere before any byte
	// has reached the client.
	ureq := s.upstreamRequest(ctx, x, ep, body)
	resp, err := s.forward(rt, x, ureq, ctx.Conn())
	fasthttp.ReleaseRequest(ureq)
	if a := x.admittedAt(); !a.IsZero() {
		s.m.queue.WithLabelValues(x.pool.Model()).Observe(a.Sub(x.received).Seconds())
	}
	if err != nil {
		s.reject(ctx, x, err)
		return
	}

	// 6. Relay: SSE event by event, or the whole body.
	if resp.StatusCode() == fasthttp.StatusOK && isEventStream(resp) {
		s.startStream(ctx, x, resp, strip)
		return
	}
	s.respondWhole(ctx, x, resp)
}

// defaultExpectedOutput is the output length assumed for a request that
// sets no max_tokens, for load accounting only.
const defaultExpectedOutput = 256

// costOf is the work a request brings to a replica, in decode-token
// equivalents: the weighted prompt, and the expected output.
func (s *Server) costOf(r *request) (prefill, output int64) {
	out := r.maxTokens
	if out <= 0 {
		out = defaultExpectedOutput
	}
	total := s.score.Cost(r.promptTokens(), out)
	return total - int64(out), int64(out)
}

// poolFor resolves the pool for a request.
func (s *Server) poolFor(rt *routeTable, model string, prefixPool *balancer.Pool) (*balancer.Pool, error) {
	if prefixPool != nil {
		return prefixPool, nil
	}
	if model == "" {
		if len(rt.pools) == 1 {
			return rt.pools[0], nil // vLLM serves its one model when none is named
		}
		return nil, badParam("model", fmt.Sprintf("required; available models: %s", availableModels(rt)))
	}
	if p, ok := rt.byModel[model]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("%w: the model %q does not exist; available models: %s", ErrUnknownModel, model, availableModels(rt))
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
	ctx.Response.Header.Set("X-Request-Id", x.id)
	if x.up != nil {
		ctx.Response.Header.Set("X-Gpurouter-Replica", x.up.replica.Name())
	}
	x.finish(err, statusOf(err))
}

// headerMaxTokens tells the client its max_tokens was clamped, and to what.
const headerMaxTokens = "X-Gpurouter-Max-Tokens"

// handleParseError answers requests fasthttp could not read (body or
// headers over the limit, a client too slow to send its request, malformed
// HTTP) with an OpenAI error; fasthttp then closes the connection.
func (s *Server) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fmt.Errorf("%w: limit is %d bytes", ErrBodyTooLarge, s.cfg.MaxBodyBytes))
	case errors.As(err, &small):
		writeError(ctx, fmt.Errorf("%w: request line and headers are limited to %d bytes", ErrHeaderTooLarge, s.cfg.MaxHeaderBytes))
	case errors.As(err, &ne) && ne.Timeout():
		writeError(ctx, fmt.Errorf("%w: the request must arrive within %s", ErrRequestTimeout, s.cfg.ReadTimeout))
	default:
		writeError(ctx, fmt.Errorf("%w: %v", ErrBadRequest, err))
	}
}
