package proxy

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"fmt"
	"html/template"
	"slices"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/proxy/auth"
	"github.com/valyala/fasthttp"
)

// The status page (GET /status, and /) is what an operator opens first, as
// HAProxy's stats page or Envoy's admin page: every pool, its replicas with
// their live load, the admission queue and the latest requests with their
// timings. It is rendered on the server and refreshes itself with a meta
// refresh, so it needs no JavaScript. It shows nothing a client could use
// against the router: no replica URLs (a client could bypass the router's
// keys and limits with them), no API keys or key ids.

// statusRefreshSeconds is how often the page reloads itself.
const statusRefreshSeconds = 5

// statusRecent is how many of the latest requests the page lists.
const statusRecent = 25

//go:embed status.html
var statusHTML string

// statusTemplate is parsed once; it is never changed after.
var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"ms":    func(s float64) string { return strconv.FormatFloat(s*1000, 'f', 1, 64) },
	"pct":   func(r float64) string { return strconv.FormatFloat(r*100, 'f', 1, 64) },
	"gib":   func(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<30), 'f', 1, 64) },
	"num":   func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"age":   func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"clock": func(ns int64) string { return time.Unix(0, ns).Format("15:04:05.000") },
}).Parse(statusHTML))

// statusView is everything the page shows, gathered at one instant.
type statusView struct {
	Now            time.Time
	RefreshSeconds int
	Active         int64 // requests in progress, the router's own count
	Draining       bool
	Pools          []poolStatus
	Recent         []Record // newest first
}

// poolStatus is one pool on the page.
type poolStatus struct {
	Model      string
	Aliases    []string
	Policy     string
	Arms       []balancer.Arm
	InFlight   int64
	Available  int // replicas a picker may choose now
	Admission  *admission.Stats
	MaxTokens  int
	Replicas   []replicaStatus
	PathPrefix string
}

// replicaStatus is one replica's row.
type replicaStatus struct {
	Name      string
	Healthy   bool
	Breaker   string // closed, open, half-open
	Notes     []string
	InFlight  int64
	Served    int64
	Engine    *balancer.EngineLoad // nil until the first telemetry scrape
	EngineAge time.Duration
	Capacity  float64 // the GPU capacity credited; 0 when no GPU telemetry
	GPUs      []gpu.GPUStats
}

// statusOf gathers the page's view from the current route table.
func (s *Server) statusOf(now time.Time) statusView {
	v := statusView{Now: now, RefreshSeconds: statusRefreshSeconds, Active: s.active.Load(), Draining: s.draining.Load()}
	for _, r := range s.routes.Load().routes {
		p := r.Pool
		ps := poolStatus{Model: p.Model(), Aliases: p.Aliases(), Policy: p.Policy(), Arms: p.Arms(), InFlight: p.InFlight(),
			Available: p.Available(now), MaxTokens: r.MaxTokens, PathPrefix: p.PathPrefix()}
		if r.Admission != nil {
			st := r.Admission.Stats()
			ps.Admission = &st
		}
		for _, rep := range p.Replicas() {
			ps.Replicas = append(ps.Replicas, replicaStatusOf(rep, now))
		}
		v.Pools = append(v.Pools, ps)
	}
	v.Recent = s.records.since(0, statusRecent)
	slices.Reverse(v.Recent)
	return v
}

func replicaStatusOf(r *balancer.Replica, now time.Time) replicaStatus {
	rs := replicaStatus{Name: r.Name(), Healthy: r.Healthy(), Breaker: r.BreakerState(), InFlight: r.InFlight(), Served: r.Served()}
	if r.Draining() {
		rs.Notes = append(rs.Notes, "draining")
	}
	if r.Resting(now) {
		rs.Notes = append(rs.Notes, "resting until "+r.RestUntil(now).Format("15:04:05"))
	}
	if e := r.EngineLoad(); e != nil {
		rs.Engine, rs.EngineAge = e, now.Sub(e.At)
	}
	if g := r.GPULoad(); g != nil {
		rs.Capacity, rs.GPUs = g.CapacityFactor, g.GPUs
		if g.Fault {
			rs.Notes = append(rs.Notes, "GPU fault (Xid/ECC): excluded")
		}
	}
	return rs
}

// serveStatus renders the page, after the status token when one is set.
func (s *Server) serveStatus(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		writeError(ctx, fmt.Errorf("%w: %s %s (use GET)", ErrMethodNotAllowed, ctx.Method(), ctx.Path()))
		ctx.Response.Header.Set("Allow", "GET, HEAD") // after writeError, which resets the response
		return
	}
	if !s.statusAllowed(ctx) {
		writeError(ctx, fmt.Errorf("%w: the status page needs the admin token: Authorization: Bearer TOKEN, or ?token=TOKEN", auth.ErrUnauthorized))
		return
	}
	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, s.statusOf(s.now())); err != nil {
		writeError(ctx, err)
		return
	}
	h := &ctx.Response.Header
	h.Set("Cache-Control", "no-store")
	// The token may be in the URL: never send it on as a referrer. The page
	// loads nothing and runs no script.
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	ctx.SetContentType("text/html; charset=utf-8")
	ctx.SetBody(buf.Bytes())
}

// statusAllowed checks the status token: as a bearer token (scripts, curl)
// or the token query parameter (a browser, whose meta refresh keeps it).
// Both compare digests in constant time.
func (s *Server) statusAllowed(ctx *fasthttp.RequestCtx) bool {
	if s.statusToken == "" {
		return true
	}
	want := sha256.Sum256([]byte(s.statusToken))
	ok := func(tok []byte) bool {
		got := sha256.Sum256(tok)
		return subtle.ConstantTimeCompare(got[:], want[:]) == 1
	}
	if tok, has := auth.BearerToken(ctx.Request.Header.Peek("Authorization")); has && ok(tok) {
		return true
	}
	tok := ctx.QueryArgs().Peek("token")
	return len(tok) > 0 && ok(tok)
}
