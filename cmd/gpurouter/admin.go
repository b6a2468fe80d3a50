package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"
	"go.uber.org/zap"
)

// adminServer is the operators' API, on its own listener behind a bearer
// token:
//
//	GET    /admin/state                                    pools, replicas, live state, the effective config
//	POST   /admin/reload                                   re-read the configuration (as SIGHUP)
//	POST   /admin/pools/{model}/replicas/{name}/drain      no new requests; in-flight finish
//	POST   /admin/pools/{model}/replicas/{name}/undrain
//	POST   /admin/pools/{model}/replicas                   add: {"url":..., "name":..., "weight":...}
//	DELETE /admin/pools/{model}/replicas/{name}            remove (in-flight finish)
//	PUT    /admin/pools/{model}/policy                     {"policy":"p2c"} or {"arms":[{"name","policy","share"}]}
//	GET    /debug/pprof/...                                Go profiles
//
// Changes made here live until the next reload from the file.
type adminServer struct {
	r      *router
	token  [32]byte // SHA-256 of the token: compared in constant time
	reload func() error
	log    *zap.Logger
	*fasthttp.Server
}

func newAdminServer(r *router, token string, reload func() error, log *zap.Logger) *adminServer {
	a := &adminServer{r: r, token: sha256.Sum256([]byte(token)), reload: reload, log: log}
	a.Server = &fasthttp.Server{Handler: a.handle, Name: "gpurouter-admin", Logger: fasthttpNop{}}
	return a
}

type fasthttpNop struct{}

func (fasthttpNop) Printf(string, ...any) {}

func (a *adminServer) authorized(ctx *fasthttp.RequestCtx) bool {
	got, ok := bytes.CutPrefix(ctx.Request.Header.Peek("Authorization"), []byte("Bearer "))
	sum := sha256.Sum256(got)
	return ok && subtle.ConstantTimeCompare(sum[:], a.token[:]) == 1
}

func (a *adminServer) handle(ctx *fasthttp.RequestCtx) {
	if !a.authorized(ctx) {
		adminError(ctx, fasthttp.StatusUnauthorized, "missing or wrong admin token (Authorization: Bearer TOKEN)")
		return
	}
	path := string(ctx.Path())
	if strings.HasPrefix(path, "/debug/pprof") {
		pprofhandler.PprofHandler(ctx)
		return
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	method := string(ctx.Method())
	switch {
	case method == "GET" && path == "/admin/state":
		a.state(ctx)
	case method == "POST" && path == "/admin/reload":
		if err := a.reload(); err != nil {
			adminError(ctx, fasthttp.StatusBadRequest, "reload rejected, configuration unchanged:\n"+err.Error())
			return
		}
		adminOK(ctx, "reloaded")
	case len(parts) >= 4 && parts[0] == "admin" && parts[1] == "pools":
		a.pool(ctx, method, parts[2], parts[3:])
	default:
		adminError(ctx, fasthttp.StatusNotFound, "no admin route "+method+" "+path)
	}
}

// pool handles /admin/pools/{model}/...
func (a *adminServer) pool(ctx *fasthttp.RequestCtx, method, model string, rest []string) {
	switch {
	case len(rest) == 3 && rest[0] == "replicas" && method == "POST" && (rest[2] == "drain" || rest[2] == "undrain"):
		rep := a.r.findReplica(model, rest[1])
		if rep == nil {
			adminError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("no replica %q in pool %q", rest[1], model))
			return
		}
		rep.SetDraining(rest[2] == "drain")
		a.log.Info("replica "+rest[2], zap.String("model", model), zap.String("replica", rest[1]))
		adminOK(ctx, rest[2]+"ed "+rest[1])
	case len(rest) == 1 && rest[0] == "replicas" && method == "POST":
		var rc replicaConfig
		if err := json.Unmarshal(ctx.PostBody(), &struct {
			URL    *string  `json:"url"`
			Name   *string  `json:"name"`
			Weight *float64 `json:"weight"`
		}{&rc.URL, &rc.Name, &rc.Weight}); err != nil {
			adminError(ctx, fasthttp.StatusBadRequest, "body: "+err.Error())
			return
		}
		a.edit(ctx, model, func(pc *poolConfig) error {
			pc.Replicas = append(pc.Replicas, rc)
			return nil
		})
	case len(rest) == 2 && rest[0] == "replicas" && method == "DELETE":
		a.edit(ctx, model, func(pc *poolConfig) error {
			for i, rc := range pc.Replicas {
				if rc.Name == rest[1] {
					pc.Replicas = append(pc.Replicas[:i:i], pc.Replicas[i+1:]...)
					return nil
				}
			}
			return fmt.Errorf("no replica %q", rest[1])
		})
	case len(rest) == 1 && rest[0] == "policy" && method == "PUT":
		var body struct {
			Policy string      `json:"policy"`
			Arms   []armConfig `json:"arms"`
		}
		if err := json.Unmarshal(ctx.PostBody(), &body); err != nil {
			adminError(ctx, fasthttp.StatusBadRequest, "body: "+err.Error())
			return
		}
		a.edit(ctx, model, func(pc *poolConfig) error {
			pc.Arms = body.Arms
			if body.Policy != "" {
				pc.Policy = body.Policy
			}
			return nil
		})
	default:
		adminError(ctx, fasthttp.StatusNotFound, "no admin route "+method+" /admin/pools/"+model+"/"+strings.Join(rest, "/"))
	}
}

// edit applies a change to one pool of the current configuration through
// the same validation and reload path as a file reload.
func (a *adminServer) edit(ctx *fasthttp.RequestCtx, model string, change func(*poolConfig) error) {
	cfg := a.r.state.Load().cfg
	cfg.Pools = append([]poolConfig(nil), cfg.Pools...)
	i := -1
	for j, pc := range cfg.Pools {
		if pc.Model == model {
			i = j
		}
	}
	if i < 0 {
		adminError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("no pool %q", model))
		return
	}
	pc := cfg.Pools[i]
	pc.Replicas = append([]replicaConfig(nil), pc.Replicas...)
	if err := change(&pc); err != nil {
		adminError(ctx, fasthttp.StatusNotFound, err.Error())
		return
	}
	cfg.Pools[i] = pc
	applyDefaults(&cfg)
	if err := validate(cfg); err != nil {
		adminError(ctx, fasthttp.StatusBadRequest, "change rejected:\n"+err.Error())
		return
	}
	if err := a.r.reload(cfg); err != nil {
		adminError(ctx, fasthttp.StatusBadRequest, "change rejected: "+err.Error())
		return
	}
	adminOK(ctx, "applied")
}

// state dumps the pools' live state and the effective configuration
// (secrets redacted).
func (a *adminServer) state(ctx *fasthttp.RequestCtx) {
	st := a.r.state.Load()
	type replicaView struct {
		Name, URL, Breaker string
		Healthy, Draining  bool
		InFlight, Served   int64
		OutstandingTokens  int64
		Engine             *balancer.EngineLoad
		GPU                *balancer.GPULoad
	}
	type poolView struct {
		Model    string
		Policy   string
		Arms     []balancer.Arm
		Replicas []replicaView
	}
	var pools []poolView
	for _, p := range st.pools {
		pv := poolView{Model: p.Model(), Policy: p.Policy(), Arms: p.Arms()}
		for _, r := range p.Replicas() {
			pv.Replicas = append(pv.Replicas, replicaView{
				Name: r.Name(), URL: r.URL(), Breaker: r.BreakerState(), Healthy: r.Healthy(), Draining: r.Draining(),
				InFlight: r.InFlight(), Served: r.Served(), OutstandingTokens: r.OutstandingTokens(),
				Engine: r.EngineLoad(), GPU: r.GPULoad(),
			})
		}
		pools = append(pools, pv)
	}
	var cfgYAML bytes.Buffer
	if err := writeConfigYAML(&cfgYAML, redacted(st.cfg)); err != nil {
		adminError(ctx, fasthttp.StatusInternalServerError, err.Error())
		return
	}
	b, _ := json.MarshalIndent(map[string]any{"pools": pools, "active_requests": a.r.srv.Active(), "config_yaml": cfgYAML.String()}, "", "  ")
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// redacted hides secrets in a configuration that will be shown.
func redacted(cfg fileConfig) fileConfig {
	if cfg.Admin.Token != "" {
		cfg.Admin.Token = "REDACTED"
	}
	return cfg
}

// findReplica finds a replica of the current pools by model and name.
func (r *router) findReplica(model, name string) *balancer.Replica {
	for _, p := range r.state.Load().pools {
		if p.Model() != model {
			continue
		}
		for _, rep := range p.Replicas() {
			if rep.Name() == name {
				return rep
			}
		}
	}
	return nil
}

func adminOK(ctx *fasthttp.RequestCtx, msg string) {
	ctx.SetContentType("application/json")
	b, _ := json.Marshal(map[string]string{"status": "ok", "message": msg})
	ctx.SetBody(b)
}

func adminError(ctx *fasthttp.RequestCtx, status int, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "code": status}})
	ctx.SetBody(b)
}
