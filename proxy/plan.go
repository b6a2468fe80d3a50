package proxy

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/fasthttp"
)

// Steps 1–2 of a request (flow.go: begin): its exchange, its body read,
// its pool and cost.

// newExchange begins an API request's exchange, with the client's
// X-Request-Id (nil: a new one): from here on it is counted (Active) and
// must be finished exactly once.
func (s *Server) newExchange(ctx *fasthttp.RequestCtx, ep openai.Endpoint, id []byte) *exchange {
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

// readBody parses an API request's body (request.go), handing its prompt
// text to sink (nil: none). It has no side effect besides sink: the request loop reads a body before deciding which path serves
// it (reqloop_linux.go).
func (s *Server) readBody(body []byte, ep openai.Endpoint, sink openai.PromptSink) (openai.Request, error) {
	p := s.parsers.Get()
	req, err := openai.ReadRequestTo(p, body, ep, sink)
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
		x.affinity = x.req.User
	}
	var err error
	x.route, err = s.routeFor(rt, x.req.Model, prefixRoute)
	if err != nil {
		return nil, false, err
	}
	ep := x.ep
	if limit := x.route.MaxTokens; limit > 0 && ep != openai.Embeddings {
		var clamped bool
		if body, clamped, err = x.req.ClampOutput(body, limit); err != nil {
			return nil, false, fmt.Errorf("%w: %w", openai.ErrBadRequest, err)
		}
		if clamped {
			ctx.Response.Header.Set(headerMaxTokens, strconv.Itoa(limit))
		}
	}
	x.cost = x.route.costOf(&x.req, ep)
	if x.prompt != nil {
		x.prompt.keys = x.prompt.prefixKeys(x.route.Pool.PrefixCache())
	}
	if err := s.permit(x); err != nil {
		return nil, false, err
	}
	if err := s.steer(hdr, x); err != nil {
		return nil, false, err
	}
	// The router needs exact token counts: ask the engine for the usage
	// chunk, and hide it again if the client did not ask for it.
	if x.req.Stream && !x.req.ClientUsage && ep != openai.Embeddings {
		if body, err = openai.WithIncludeUsage(body, &x.req); err != nil {
			return nil, false, fmt.Errorf("%w: %v", openai.ErrBadRequest, err)
		}
		return body, true, nil
	}
	return body, false, nil
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
		return nil, openai.BadParam("model", fmt.Sprintf("required; available models: %s", availableModels(rt)))
	}
	if r, ok := rt.byModel[model]; ok {
		return r, nil
	}
	if r := rt.adapterRoute(model); r != nil {
		return r, nil
	}
	return nil, fmt.Errorf("%w: the model %q does not exist; available models: %s", ErrUnknownModel, model, availableModels(rt))
}

// costOf is a request's cost on this route, worked out once: the pool's
// estimator corrects the prompt's raw size and fills in the expected
// output when max_tokens is not given; embeddings generate nothing.
func (r *poolRoute) costOf(req *openai.Request, ep openai.Endpoint) admission.Cost {
	if ep == openai.Embeddings {
		return r.est.PromptCost(req.PromptTokens())
	}
	return r.est.Cost(req.PromptTokens(), req.MaxTokens)
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

// headerMaxTokens tells the client its max_tokens was clamped, and to what.
const headerMaxTokens = "X-Gpurouter-Max-Tokens"
