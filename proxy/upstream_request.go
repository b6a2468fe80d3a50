package proxy

import (
	"bytes"
	"net"
	"net/netip"
	"strconv"

	"github.com/gpurouter/gpurouter/tracing"
	"github.com/valyala/fasthttp"
)

// The request the replicas are sent: the goroutine path builds it as a
// fasthttp.Request (upstreamRequest), the request loop as bytes
// (upstreamWire), both from the same headers.

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 §7.6.1), plus Accept-Encoding: the router must read the
// engine's stream, so it asks for identity.
var hopByHop = [...][]byte{
	[]byte("Connection"), []byte("Keep-Alive"), []byte("Proxy-Authenticate"),
	[]byte("Proxy-Authorization"), []byte("Proxy-Connection"), []byte("Te"),
	[]byte("Trailer"), []byte("Transfer-Encoding"), []byte("Upgrade"),
}

func isHopByHop(k []byte) bool {
	for _, h := range hopByHop {
		// By length first: most names match none, and are told so without
		// a comparison (every request's headers pass here).
		if len(k) == len(h) && bytes.EqualFold(k, h) {
			return true
		}
	}
	return false
}

// routerSets are the request headers the router sets itself (or drops):
// a client's are not forwarded.
var routerSets = [...][]byte{
	[]byte("Accept-Encoding"), []byte("Content-Length"), []byte("Host"),
	[]byte("X-Request-Id"), []byte(seqHeader), []byte("X-Forwarded-For"),
}

func isRouterSet(k []byte) bool {
	for _, h := range routerSets {
		if len(k) == len(h) && bytes.EqualFold(k, h) {
			return true
		}
	}
	return false
}

// upstreamRequest builds the request sent to replicas on the goroutine
// path: the client's headers minus hop-by-hop ones, the request id, and
// body (the flow's: plan's, startMigration's). The API key of a client
// that authenticated to the router is not forwarded: the engines have
// their own, if any.
func (s *Server) upstreamRequest(ctx *fasthttp.RequestCtx, x *exchange, body []byte) *fasthttp.Request {
	u := fasthttp.AcquireRequest()
	u.Header.SetMethod(fasthttp.MethodPost)
	u.SetRequestURI(x.ep.Path())
	forwardedHeaders(&ctx.Request.Header, x, u.Header.SetBytesKV)
	var own [128]byte
	seq, xff := s.routerHeaders(ctx, x, own[:0])
	u.Header.Set("X-Request-Id", x.id)
	u.Header.SetBytesV(seqHeader, seq)
	u.Header.SetBytesV("X-Forwarded-For", xff)
	u.SetBodyRaw(body)
	return u
}

// forwardedHeaders calls add with each of the client's headers the
// replicas get: all but the hop-by-hop ones (and those its Connection
// header names), Content-Length and Host (the request's own),
// Accept-Encoding (the router reads the body), the client's key when the
// router authenticated it, and those the router sets itself
// (routerHeaders), and — while tracing is on — the client's trace
// context, which the router replaces with its own (trace.go). One set for the goroutine path's fasthttp.Request and
// the request loop's bytes (upstreamWire).
func forwardedHeaders(h *fasthttp.RequestHeader, x *exchange, add func(k, v []byte)) {
	// Headers named in Connection are hop-by-hop too (RFC 9110 §7.6.1).
	connHdr := h.Peek("Connection")
	stripAuth, traced := x.principal.Authenticated(), x.tr != nil
	h.VisitAll(func(k, v []byte) {
		if isHopByHop(k) || isRouterSet(k) || (len(connHdr) > 0 && listsToken(connHdr, k)) ||
			(stripAuth && bytes.EqualFold(k, []byte("Authorization"))) || (traced && tracing.IsTraceHeader(k)) {
			return
		}
		add(k, v)
	})
}

// routerHeaders are the values of the headers the router adds, besides
// X-Request-Id (x.id), written into buf (128 bytes do: a few hops, the
// longest IPv6 text form last): the request's own number (x.seq, given
// here), which finds its connection should the client leave before the
// engine answers (see pendingSet) — X-Request-Id can't, a client may send
// the same one twice — and the X-Forwarded-For chain.
func (s *Server) routerHeaders(ctx *fasthttp.RequestCtx, x *exchange, buf []byte) (seq, xff []byte) {
	x.seq = s.seq.Add(1)
	buf = strconv.AppendUint(buf[:0], x.seq, 10)
	n := len(buf)
	// The client's address joins the chain of the proxies it came
	// through, as nginx's $proxy_add_x_forwarded_for has it: behind a load
	// balancer or a sidecar, the engine still learns who asked.
	buf = appendForwardedFor(buf, &ctx.Request.Header, ctx.RemoteIP())
	return buf[:n], buf[n:]
}

// appendForwardedFor appends an X-Forwarded-For value: the chain the
// request came with (in order, a client may send the header more than
// once), then ip.
func appendForwardedFor(b []byte, h *fasthttp.RequestHeader, ip net.IP) []byte {
	for k, v := range h.All() {
		if v = bytes.TrimSpace(v); len(v) > 0 && bytes.EqualFold(k, []byte("X-Forwarded-For")) {
			b = append(append(b, v...), ", "...)
		}
	}
	return appendIP(b, ip)
}

// appendIP appends ip's text form, as net.IP.String writes it, without
// allocating: an IPv4 address in its dotted form, whether it is held in 4
// or 16 bytes.
func appendIP(b []byte, ip net.IP) []byte {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return append(b, ip.String()...)
	}
	return a.Unmap().AppendTo(b)
}

// listsToken reports whether a comma-separated header value names tok.
func listsToken(list, tok []byte) bool {
	for len(list) > 0 {
		var item []byte
		item, list, _ = bytes.Cut(list, []byte(","))
		if bytes.EqualFold(bytes.TrimSpace(item), tok) {
			return true
		}
	}
	return false
}
