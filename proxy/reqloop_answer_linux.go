//go:build linux

package proxy

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/gpurouter/gpurouter/internal/h1"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
)

// A whole answer relayed from its bytes. fasthttp's path parses the
// engine's head into a Response (ReadLimitBody), copies its fields into
// the client's (copyHeaders) and serializes those again (Response.Write):
// about 7% of a request's CPU on a loop at c=64, and all of it on the
// client's wait (`perf record` of `bench proxy-cost`'s router,
// 2026-11-27). An answer that needs none of that machinery — a 200 with a
// Content-Length and a Content-Type, to an HTTP/1.1 client, whose head has
// no field that fasthttp's header keeps apart (Set-Cookie,
// Content-Encoding), that repeats, that the router sets itself, or whose
// value fasthttp's parse refuses — is written from the engine's head
// instead, field by field, in the order and spelling fasthttp's
// serialization gives them. Every other answer
// takes fasthttp's path (whole). The decisions are the same functions'
// either way: judge passes every answer of its status (passesOnStatus),
// checkWhole checks its body, wholeBody does its accounting.
// TestRequestLoopRawAnswersAreFasthttps holds the two paths to the same
// bytes.

// maxRawFields bounds the engine fields an answer relayed from its bytes
// may pass on (a vLLM answer passes none: its date, server, length and
// type are the router's to write); one with more takes fasthttp's path.
const maxRawFields = 16

// rawField is an engine's response field the client gets.
type rawField struct{ name, value []byte }

// rawAnswer relays u's whole answer to c from its bytes when it can;
// false when it did nothing, and the answer takes fasthttp's path.
func (l *requestLoop) rawAnswer(c *loopConn, u *loopConn) bool {
	r := c.r
	ctx := r.f.ctx
	if u.toClose || !ctx.Request.Header.IsHTTP11() {
		return false
	}
	head, status, ok := h1.ReadHead(u.in.B[u.headAt:u.headLen])
	if !ok || status != fasthttp.StatusOK || !passesOnStatus(status) {
		return false
	}
	var (
		kept        [maxRawFields]rawField
		n           int
		ctype       []byte
		length      = -1
		engineClose bool
	)
	for {
		name, value, ok := head.Next()
		if !ok {
			break
		}
		if !h1.ValidValue(value) {
			return false // fasthttp's parse refuses the answer: an attempt that failed
		}
		switch {
		case h1.EqualFold(name, "content-type"):
			if ctype != nil || len(value) == 0 {
				return false
			}
			ctype = value
		case h1.EqualFold(name, "content-length"):
			length = 0 // digits only, and one of them: ResponseEnd took no other
			for _, d := range value {
				length = length*10 + int(d-'0')
			}
		case h1.EqualFold(name, "connection"):
			// A close anywhere in the list is taken at its word, where
			// fasthttp's parse reads only an exact "close" (and keeps a
			// connection the engine then closes: a stale one).
			engineClose = hasCloseToken(value)
		case droppedAnswerHeader(name):
		case h1.EqualFold(name, "set-cookie"), h1.EqualFold(name, "content-encoding"),
			h1.EqualFold(name, "x-request-id"), h1.EqualFold(name, "x-gpurouter-replica"):
			return false
		default:
			if n == len(kept) || ctx.Response.Header.PeekBytes(name) != nil {
				return false // the router set it already: fasthttp's Set replaces it in place
			}
			for _, f := range kept[:n] {
				if bytes.EqualFold(f.name, name) {
					return false // fasthttp's Set keeps the last only
				}
			}
			kept[n] = rawField{name, value}
			n++
		}
	}
	if !head.Ended() || ctype == nil || length < 0 || u.headLen+length > len(u.in.B) || !plainRouterHeaders(ctx) ||
		strings.ContainsAny(r.f.up.replica.Name(), "\r\n") { // fasthttp's Set would blank them
		return false
	}

	// From here on as whole, flow.whole and respond do it.
	l.s.m.rawAnswers.Inc()
	s, x := l.s, r.f.x
	buf := bytebufferpool.Get()
	buf.B = append(buf.B[:0], u.in.B[u.headLen:u.headLen+length]...)
	l.ans = l.appendRawHead(l.ans[:0], ctx, ctype, length, kept[:n])
	extra := u.extra
	bytebufferpool.Put(u.in)
	u.in = nil
	r.u = nil
	if engineClose || extra {
		u.peer = nil
		l.closeUpstream(u)
	} else {
		l.putIdle(u)
	}
	r.phase = 0
	r.f.took() // judge passes it (passesOnStatus)
	var members openai.ObjectMembers
	if err := checkWhole(x, status, buf.B, &members); err != nil {
		bytebufferpool.Put(buf)
		l.act(c, r.f.bodyFailed(err))
		return true
	}
	closing := ctx.Request.Header.ConnectionClose() || s.draining.Load() || ctx.Response.ConnectionClose()
	l.ans = append(l.ans, "X-Gpurouter-Replica: "...)
	l.ans = append(l.ans, x.up.replica.Name()...)
	l.ans = append(l.ans, "\r\n"...)
	if closing {
		l.ans = append(l.ans, "Connection: close\r\n"...)
	}
	l.ans = append(l.ans, "\r\n"...)
	l.ans = append(l.ans, buf.B...)
	c.r = nil // the exchange is the answer's now: a failed write ends it (wholeBody)
	wb := wholeBody{x: x, buf: buf, status: status}
	wb.setUsage(members.Member(buf.B, "usage"))
	l.w.c = c
	_, err := l.w.Write(l.ans)
	wb.off, wb.sent = len(buf.B), err == nil
	wb.CloseWithError(err) //nolint:errcheck // always nil
	l.done(c, r, err, closing)
	return true
}

// plainRouterHeaders reports whether the header the router built on ctx
// for the answer so far (its X-Request-Id, a clamp's note) holds only
// plain fields: none that fasthttp writes apart from the rest, or that
// the answer's head sets.
func plainRouterHeaders(ctx *fasthttp.RequestCtx) bool {
	for k := range ctx.Response.Header.All() {
		switch string(k) {
		case fasthttp.HeaderServer, fasthttp.HeaderContentEncoding, fasthttp.HeaderSetCookie, fasthttp.HeaderTrailer,
			fasthttp.HeaderContentLength, fasthttp.HeaderDate, "X-Gpurouter-Replica":
			return false
		}
	}
	return true
}

// hasCloseToken reports whether a Connection field's value lists close,
// in any case.
func hasCloseToken(v []byte) bool {
	for len(v) > 0 {
		i := bytes.IndexByte(v, ',')
		if i < 0 {
			i = len(v)
		}
		if bytes.EqualFold(bytes.TrimSpace(v[:i]), []byte("close")) {
			return true
		}
		v = v[min(i+1, len(v)):]
	}
	return false
}

// appendRawHead appends the client's head as fasthttp writes it for
// respondWhole's Response, but for the replica's name and the connection's
// close, which rawAnswer appends once the answer is judged: status line,
// server, date, type, length, the router's fields so far, then the
// engine's.
func (l *requestLoop) appendRawHead(dst []byte, ctx *fasthttp.RequestCtx, ctype []byte, length int, kept []rawField) []byte {
	dst = append(dst, "HTTP/1.1 200 OK\r\n"...)
	if name := l.s.serverName(); name != "" {
		dst = append(dst, "Server: "...)
		dst = append(dst, name...)
		dst = append(dst, "\r\n"...)
	}
	dst = append(dst, "Date: "...)
	dst = append(dst, l.date()...)
	dst = append(dst, "\r\nContent-Type: "...)
	dst = append(dst, ctype...)
	dst = append(dst, "\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(length), 10)
	dst = append(dst, "\r\n"...)
	for k, v := range ctx.Response.Header.All() {
		if string(k) == fasthttp.HeaderContentType || string(k) == fasthttp.HeaderConnection {
			continue // the answer's type, and the close rawAnswer decides
		}
		dst = appendField(dst, k, v)
	}
	for _, f := range kept {
		dst = appendFieldName(dst, f.name)
		dst = append(dst, ": "...)
		dst = append(dst, f.value...)
		dst = append(dst, "\r\n"...)
	}
	return dst
}

func appendField(dst, name, value []byte) []byte {
	dst = append(dst, name...)
	dst = append(dst, ": "...)
	dst = append(dst, value...)
	return append(dst, "\r\n"...)
}

// appendFieldName appends a field name as fasthttp normalizes it: a
// capital first and after each '-', the other letters small.
func appendFieldName(dst, name []byte) []byte {
	upper := true
	for _, c := range name {
		switch {
		case upper && 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case !upper && 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		upper = c == '-'
		dst = append(dst, c)
	}
	return dst
}

// date is the Date field's value for this wake-up, formatted once a
// second.
func (l *requestLoop) date() []byte {
	if sec := l.now.Unix(); sec != l.dateSec || l.dateText == nil {
		l.dateSec = sec
		l.dateText = fasthttp.AppendHTTPDate(l.dateText[:0], l.now)
	}
	return l.dateText
}
