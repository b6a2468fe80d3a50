package proxy

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/gpurouter/gpurouter/proxy/observe"
	"github.com/prometheus/common/expfmt"
	"github.com/valyala/fasthttp"
)

// apiRoute resolves a path to an OpenAI endpoint and, for a pool's
// dedicated path prefix, that pool's route. A POST to exactly a prefix is a chat
// completion unless the prefix names another endpoint; under a prefix the
// usual paths work too (/v1/chat/tinyllama/v1/completions).
func (rt *routeTable) apiRoute(path string) (openai.Endpoint, *poolRoute) {
	if ep := endpointOf(path); ep != 0 {
		return ep, nil
	}
	for _, pr := range rt.prefixes {
		if !strings.HasPrefix(path, pr.prefix) {
			continue
		}
		rest := path[len(pr.prefix):]
		switch {
		case rest == "" || rest == "/":
			switch {
			case strings.HasPrefix(pr.prefix, "/v1/completions"):
				return openai.Completions, pr.route
			case strings.HasPrefix(pr.prefix, "/v1/embeddings"):
				return openai.Embeddings, pr.route
			}
			return openai.Chat, pr.route
		case rest[0] == '/':
			if ep := endpointOf(rest); ep != 0 {
				return ep, pr.route
			}
		}
	}
	return 0, nil
}

func endpointOf(path string) openai.Endpoint {
	switch path {
	case "/v1/chat/completions":
		return openai.Chat
	case "/v1/completions":
		return openai.Completions
	case "/v1/embeddings":
		return openai.Embeddings
	}
	return 0
}

// modelsJSON renders /v1/models from the router's own view of its pools.
func modelsJSON(names []string, now time.Time) []byte {
	type card struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	doc := struct {
		Object string `json:"object"`
		Data   []card `json:"data"`
	}{Object: "list", Data: []card{}}
	for _, n := range names {
		doc.Data = append(doc.Data, card{ID: n, Object: "model", Created: now.Unix(), OwnedBy: "gpurouter"})
	}
	b, _ := json.Marshal(doc)
	return b
}

func (s *Server) serveModels(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.SetBody(s.routes.Load().models)
}

// serveReady answers 200 when every pool has a replica a picker could
// choose, else 503 naming the pools that have none.
func (s *Server) serveReady(ctx *fasthttp.RequestCtx) {
	now := s.now()
	var missing []string
	for _, p := range s.routes.Load().pools {
		if p.Available(now) == 0 {
			missing = append(missing, p.Model())
		}
	}
	ctx.SetContentType("application/json")
	switch {
	case s.draining.Load():
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"status":"draining"}`)
	case len(missing) > 0:
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		b, _ := json.Marshal(map[string]any{"status": "not ready", "pools_without_healthy_replicas": missing})
		ctx.SetBody(b)
	default:
		ctx.SetBodyString(`{"status":"ready"}`)
	}
}

func (s *Server) serveMetrics(ctx *fasthttp.RequestCtx) {
	mfs, err := s.gather.Gather()
	if err != nil && len(mfs) == 0 {
		writeError(ctx, err)
		return
	}
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	ctx.SetContentType(string(format))
	enc := expfmt.NewEncoder(ctx, format)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return
		}
	}
}

// serveDebugRequests returns recent per-request records:
// ?since=UNIX_NS (records finished at or after), ?limit=N.
func (s *Server) serveDebugRequests(ctx *fasthttp.RequestCtx) {
	args := ctx.QueryArgs()
	since, _ := strconv.ParseInt(string(args.Peek("since")), 10, 64)
	limit, _ := strconv.Atoi(string(args.Peek("limit")))
	b, err := observe.RecordsJSON(s.records.Since(since, limit))
	if err != nil {
		writeError(ctx, err)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// serveDebugPools shows pools, policies and every replica's live state.
func (s *Server) serveDebugPools(ctx *fasthttp.RequestCtx) {
	type replicaView struct {
		Name              string                  `json:"name"`
		URL               string                  `json:"url"`
		Weight            float64                 `json:"weight"`
		Healthy           bool                    `json:"healthy"`
		Draining          bool                    `json:"draining"`
		Breaker           string                  `json:"breaker"`
		InFlight          int64                   `json:"in_flight"`
		Served            int64                   `json:"served"`
		OutstandingTokens int64                   `json:"outstanding_tokens"`
		DecodeTokensPerS  float64                 `json:"decode_tokens_per_s"`
		Predictor         balancer.PredictorState `json:"predictor"`
		Engine            *balancer.EngineLoad    `json:"engine,omitempty"`
		GPU               *balancer.GPULoad       `json:"gpu,omitempty"`
	}
	type poolView struct {
		Model      string         `json:"model"`
		Aliases    []string       `json:"aliases"`
		PathPrefix string         `json:"path_prefix,omitempty"`
		Policy     string         `json:"policy"`
		Arms       []balancer.Arm `json:"arms"`
		InFlight   int64          `json:"in_flight"`
		Replicas   []replicaView  `json:"replicas"`
	}
	var doc struct {
		Pools []poolView `json:"pools"`
	}
	for _, p := range s.routes.Load().pools {
		pv := poolView{Model: p.Model(), Aliases: p.Aliases(), PathPrefix: p.PathPrefix(), Policy: p.Policy(), Arms: p.Arms(), InFlight: p.InFlight()}
		for _, r := range p.Replicas() {
			pv.Replicas = append(pv.Replicas, replicaView{
				Name: r.Name(), URL: r.URL(), Weight: r.Weight(), Healthy: r.Healthy(), Draining: r.Draining(),
				Breaker: r.BreakerState(), InFlight: r.InFlight(), Served: r.Served(),
				OutstandingTokens: r.OutstandingTokens(), DecodeTokensPerS: r.DecodeSpeed(), Predictor: r.Predictor(),
				Engine: r.EngineLoad(), GPU: r.GPULoad(),
			})
		}
		doc.Pools = append(doc.Pools, pv)
	}
	b, _ := json.Marshal(doc)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// requestPath is ctx's path as fasthttp's Path gives it, read from the
// request line without the URI's parse when the two cannot differ: a path
// of letters, digits, '-', '_' and single slashes has nothing to decode or
// normalize, and no query. The parse (the host's and the path's) took
// 0.4 µs of the 11 µs a request loop spent on a request before sending it
// at c=1 (`perf record`, `bench proxy-cost`'s workload).
func requestPath(ctx *fasthttp.RequestCtx) []byte {
	uri := ctx.Request.Header.RequestURI()
	if len(uri) == 0 || uri[0] != '/' {
		return ctx.Path()
	}
	for i, c := range uri {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		case c == '/' && (i == 0 || uri[i-1] != '/'):
		default:
			return ctx.Path()
		}
	}
	return uri
}

// serveDebugLatency answers GET /debug/latency?since=UNIX_NS&until=UNIX_NS:
// per pool and replica, the router's ITL and queue-time sketches merged
// over the windows the interval overlaps. until defaults to now and since
// to until minus the retention; either later than now counts as now, so a
// client whose clock runs ahead reads the current window.
func (s *Server) serveDebugLatency(ctx *fasthttp.RequestCtx) {
	now := s.now()
	args := ctx.QueryArgs()
	// Each no later than now (UnixNano of a time, which has no min).
	at := func(name string, def time.Time) time.Time {
		v, err := strconv.ParseInt(string(args.Peek(name)), 10, 64)
		if err != nil {
			return def
		}
		return time.Unix(0, min(v, now.UnixNano()))
	}
	until := at("until", now)
	since := at("since", until.Add(-observe.LatencyRetention))
	b, err := json.Marshal(s.lat.Collect(since, until))
	if err != nil {
		writeError(ctx, err)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
