package proxy

import (
	"github.com/gpurouter/gpurouter/proxy/auth"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// Client authentication on the request path. With a KeyStore set
// (Options.Keys, SetKeys) every API request and /v1/models needs
// "Authorization: Bearer KEY"; /health, /ready, /metrics and /debug/* stay
// open: they are the operators' endpoints and carry no client data. The
// client's Authorization header is not forwarded to the engines then.

// authMetrics count authentication decisions by key id (never the key; ""
// when no valid key was presented) and result.
type authMetrics struct {
	decisions *prometheus.CounterVec // key_id, result
}

func newAuthMetrics(reg prometheus.Registerer) (*authMetrics, error) {
	m := &authMetrics{decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpurouter_auth_requests_total",
		Help: "API requests checked against client API keys, by key id (\"\" when no valid key was presented) and result: ok, unauthorized, forbidden, rate_limited_requests, rate_limited_tokens.",
	}, []string{"key_id", "result"})}
	if err := reg.Register(m.decisions); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *authMetrics) record(p auth.Principal, err error) {
	m.decisions.WithLabelValues(p.ID, auth.Result(err)).Inc()
}

// SetKeys turns client authentication on with ks, swaps the store, or
// (nil) turns it off, for requests that arrive from now on.
func (s *Server) SetKeys(ks *auth.KeyStore) { s.keys.Store(ks) }

// Keys is the store in force; nil when authentication is off.
func (s *Server) Keys() *auth.KeyStore { return s.keys.Load() }

// authenticate finds the request's API key when authentication is on,
// before anything else is looked at: a client without a valid key learns
// nothing, not even which models exist. The store is remembered for
// permit, so one request sees one generation of keys.
func (s *Server) authenticate(authorization []byte, x *exchange) error {
	ks := s.keys.Load()
	if ks == nil {
		return nil
	}
	p, err := ks.Authenticate(authorization)
	if err != nil {
		s.authM.record(p, err)
		return err
	}
	x.keys, x.principal = ks, p
	return nil
}

// permit checks the authenticated key against the request once its pool
// and cost are known: the key must allow the pool's model and be within
// its rate limits, charged the request's cost in tokens. The key's tier and
// id become the request's priority class and tenant.
func (s *Server) permit(x *exchange) error {
	if x.keys == nil {
		return nil
	}
	err := x.keys.Permit(x.principal, x.route.Pool.Model(), x.cost.Tokens())
	s.authM.record(x.principal, err)
	x.cost.Class, x.cost.Tenant = x.principal.Tier, x.principal.ID
	return err
}

// serveModelsAuth is /v1/models: with authentication on it needs a valid
// key and lists only the models the key may use.
func (s *Server) serveModelsAuth(ctx *fasthttp.RequestCtx) {
	ks := s.keys.Load()
	if ks == nil {
		s.serveModels(ctx)
		return
	}
	p, err := ks.Authenticate(ctx.Request.Header.Peek("Authorization"))
	if err != nil {
		s.authM.record(p, err)
		writeError(ctx, err)
		return
	}
	if p.AllModels() {
		s.serveModels(ctx)
		return
	}
	var names []string
	for _, pool := range s.routes.Load().pools {
		if p.Allows(pool.Model()) {
			names = append(names, pool.Model())
			names = append(names, pool.Aliases()...)
		}
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(modelsJSON(names, s.now()))
}
