package proxy

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"slices"
	"time"

	"github.com/gpurouter/gpurouter/proxy/auth"
	"github.com/gpurouter/gpurouter/proxy/observe"
	"github.com/valyala/fasthttp"
)

// The status page (GET /status, and /): its view gathered from the route
// table and the latest records, rendered by observe.

// statusOf gathers the page's view from the current route table.
func (s *Server) statusOf(now time.Time) observe.StatusView {
	v := observe.StatusView{Now: now, RefreshSeconds: observe.StatusRefreshSeconds, Active: s.active.Load(), Draining: s.draining.Load()}
	for _, r := range s.routes.Load().routes {
		p := r.Pool
		ps := observe.PoolStatus{Model: p.Model(), Aliases: p.Aliases(), Policy: p.Policy(), Arms: p.Arms(), InFlight: p.InFlight(),
			Available: p.Available(now), MaxTokens: r.MaxTokens, PathPrefix: p.PathPrefix()}
		if r.Admission != nil {
			st := r.Admission.Stats()
			ps.Admission = &st
		}
		for _, rep := range p.Replicas() {
			ps.Replicas = append(ps.Replicas, observe.ReplicaStatusOf(rep, now))
		}
		v.Pools = append(v.Pools, ps)
	}
	v.Recent = s.records.Since(0, observe.StatusRecent)
	slices.Reverse(v.Recent)
	return v
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
	if err := observe.RenderStatus(&buf, s.statusOf(s.now())); err != nil {
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
