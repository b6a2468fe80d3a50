package fleet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"
	"go.uber.org/zap"
)

// AdminOptions are the admin API's plug points. Zero fields take the
// defaults noted.
type AdminOptions struct {
	Token string // the bearer token every request needs; only its SHA-256 is kept
	// Reload re-reads the configuration, as SIGHUP does (POST
	// /admin/reload); nil answers that reloads are not configured.
	Reload func() error
	// Render is the "config_yaml" of GET /admin/state: the effective
	// configuration for spec, secrets redacted; nil leaves it empty.
	Render func(spec Spec) (string, error)
	// Active is "active_requests" of GET /admin/state; nil reports 0.
	Active func() int64
	// ShutdownGrace is how long Run lets requests in progress finish once
	// its context ends before closing their connections [2s].
	ShutdownGrace time.Duration
	Log           *zap.Logger // nil means no logging
}

// Admin is the operators' API, on its own listener behind a bearer token:
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
// Edits made here are Fleet edits: they live until the next reload from
// the file. Build with NewAdmin (the zero value is unusable); Run serves.
type Admin struct {
	f     *Fleet
	ln    net.Listener
	token [32]byte // SHA-256 of the token: compared in constant time
	o     AdminOptions
	srv   *fasthttp.Server

	mu    sync.Mutex // guards conns
	conns map[net.Conn]struct{}
	gone  *sync.Cond // on mu: a connection ended
}

// NewAdmin builds the admin API of f, to serve on ln. It starts nothing.
func NewAdmin(f *Fleet, ln net.Listener, o AdminOptions) *Admin {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = 2 * time.Second
	}
	a := &Admin{f: f, ln: ln, token: sha256.Sum256([]byte(o.Token)), o: o, conns: map[net.Conn]struct{}{}}
	a.gone = sync.NewCond(&a.mu)
	a.srv = &fasthttp.Server{Handler: a.handle, Name: "gpurouter-admin", Logger: fasthttpNop{}, ConnState: a.track, CloseOnShutdown: true}
	return a
}

// Run serves until ctx ends, then stops: requests in progress get
// ShutdownGrace to finish, and connections still open after it (a client's
// idle keep-alive, a long profile) are closed, so nothing outlives Run.
func (a *Admin) Run(ctx context.Context) error {
	served := make(chan error, 1)
	go func() { served <- a.srv.Serve(a.ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	grace, cancel := context.WithTimeout(context.Background(), a.o.ShutdownGrace)
	defer cancel()
	if err := a.srv.ShutdownWithContext(grace); err != nil {
		a.mu.Lock()
		for c := range a.conns {
			c.Close()
		}
		// Each connection's goroutine reports StateClosed as it ends
		// (a handler still running, such as a CPU profile, first
		// finishes writing to its closed connection).
		for len(a.conns) > 0 {
			a.gone.Wait()
		}
		a.mu.Unlock()
	}
	<-served
	return nil
}

// track keeps the open connections, for Run to close at the end.
func (a *Admin) track(c net.Conn, s fasthttp.ConnState) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch s {
	case fasthttp.StateNew:
		a.conns[c] = struct{}{}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		delete(a.conns, c)
		a.gone.Broadcast()
	}
}

type fasthttpNop struct{}

func (fasthttpNop) Printf(string, ...any) {}

func (a *Admin) authorized(ctx *fasthttp.RequestCtx) bool {
	got, ok := bytes.CutPrefix(ctx.Request.Header.Peek("Authorization"), []byte("Bearer "))
	sum := sha256.Sum256(got)
	return ok && subtle.ConstantTimeCompare(sum[:], a.token[:]) == 1
}

func (a *Admin) handle(ctx *fasthttp.RequestCtx) {
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
		if a.o.Reload == nil {
			adminError(ctx, fasthttp.StatusNotFound, "reload is not configured")
			return
		}
		if err := a.o.Reload(); err != nil {
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
func (a *Admin) pool(ctx *fasthttp.RequestCtx, method, model string, rest []string) {
	switch {
	case len(rest) == 3 && rest[0] == "replicas" && method == "POST" && (rest[2] == "drain" || rest[2] == "undrain"):
		rep := a.f.Replica(model, rest[1])
		if rep == nil {
			adminError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("no replica %q in pool %q", rest[1], model))
			return
		}
		rep.SetDraining(rest[2] == "drain")
		a.o.Log.Info("replica "+rest[2], zap.String("model", model), zap.String("replica", rest[1]))
		adminOK(ctx, rest[2]+"ed "+rest[1])
	case len(rest) == 1 && rest[0] == "replicas" && method == "POST":
		var r Replica
		if err := json.Unmarshal(ctx.PostBody(), &struct {
			URL    *string  `json:"url"`
			Name   *string  `json:"name"`
			Weight *float64 `json:"weight"`
		}{&r.URL, &r.Name, &r.Weight}); err != nil {
			adminError(ctx, fasthttp.StatusBadRequest, "body: "+err.Error())
			return
		}
		a.edited(ctx, a.f.AddReplica(model, r))
	case len(rest) == 2 && rest[0] == "replicas" && method == "DELETE":
		a.edited(ctx, a.f.RemoveReplica(model, rest[1]))
	case len(rest) == 1 && rest[0] == "policy" && method == "PUT":
		var body struct {
			Policy string         `json:"policy"`
			Arms   []balancer.Arm `json:"arms"` // {"name","policy","share"}
		}
		if err := json.Unmarshal(ctx.PostBody(), &body); err != nil {
			adminError(ctx, fasthttp.StatusBadRequest, "body: "+err.Error())
			return
		}
		a.edited(ctx, a.f.SetPolicy(model, body.Policy, body.Arms))
	default:
		adminError(ctx, fasthttp.StatusNotFound, "no admin route "+method+" /admin/pools/"+model+"/"+strings.Join(rest, "/"))
	}
}

// edited answers an edit's outcome.
func (a *Admin) edited(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case err == nil:
		adminOK(ctx, "applied")
	case errors.Is(err, ErrNoPool), errors.Is(err, ErrNoReplica):
		adminError(ctx, fasthttp.StatusNotFound, err.Error())
	default:
		adminError(ctx, fasthttp.StatusBadRequest, "change rejected:\n"+err.Error())
	}
}

// state dumps the pools' live state and the effective configuration.
func (a *Admin) state(ctx *fasthttp.RequestCtx) {
	st := a.f.state.Load()
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
	for _, rt := range st.routes {
		p := rt.Pool
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
	var cfgYAML string
	if a.o.Render != nil {
		var err error
		if cfgYAML, err = a.o.Render(st.spec.clone()); err != nil {
			adminError(ctx, fasthttp.StatusInternalServerError, err.Error())
			return
		}
	}
	var active int64
	if a.o.Active != nil {
		active = a.o.Active()
	}
	b, _ := json.MarshalIndent(map[string]any{"pools": pools, "active_requests": active, "config_yaml": cfgYAML}, "", "  ")
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
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
