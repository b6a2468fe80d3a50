package proxy

import (
	"bytes"
	"fmt"
	"io"
	"unsafe"

	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
)

// The answer a client gets, on either path: a stream's head and relay, a
// whole answer, the headers the router passes on and its own.

func isEventStream(resp *fasthttp.Response) bool {
	return bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream"))
}

// copyHeaders copies the upstream response headers the client should see.
func copyHeaders(ctx *fasthttp.RequestCtx, resp *fasthttp.Response, x *exchange) {
	resp.Header.VisitAll(func(k, v []byte) {
		if droppedAnswerHeader(k) {
			return
		}
		ctx.Response.Header.SetBytesKV(k, v)
	})
	setOwnHeader(&ctx.Response.Header, "X-Request-Id", x.id)
	ctx.Response.Header.Set("X-Gpurouter-Replica", x.up.replica.Name())
}

// droppedAnswerHeader reports whether an engine's response header is one
// the client does not get from it: hop-by-hop, or one the router's server
// writes itself.
func droppedAnswerHeader(k []byte) bool {
	return isHopByHop(k) || bytes.EqualFold(k, []byte("Content-Length")) || bytes.EqualFold(k, []byte("Server")) ||
		bytes.EqualFold(k, []byte("Date"))
}

// setOwnHeader sets one of the router's own response headers, its name
// given as fasthttp normalizes it: Set would normalize a copy of the name
// on every request. Both are copied in; value must hold no line break
// (Set would have replaced them).
func setOwnHeader(h *fasthttp.ResponseHeader, canonical, value string) {
	h.SetCanonical(unsafe.Slice(unsafe.StringData(canonical), len(canonical)), unsafe.Slice(unsafe.StringData(value), len(value)))
}

// streamHead builds a stream's head on the client's answer, on either
// path: the engine's headers the client gets, 200, no caching.
func streamHead(ctx *fasthttp.RequestCtx, resp *fasthttp.Response, x *exchange) {
	copyHeaders(ctx, resp, x)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.Response.Header.Set("Cache-Control", "no-cache")
}

// startStream is actStream on the goroutine path: it commits the head and
// hands the engine's stream to a relay, which runs once the handler
// returns: on the connection itself (hijack.go), or as the body fasthttp
// writes.
func (s *Server) startStream(f *flow, resp *fasthttp.Response, w *clientWatch) {
	ctx, x := f.ctx, f.x
	streamHead(ctx, resp, x)
	ctx.Response.ImmediateHeaderFlush = true
	body := resp.BodyStream().(fasthttp.ReadCloserWithError)
	hj := hijackable(ctx)
	if hj && !s.cfg.GoroutineStreams && ctx.Request.Header.IsHTTP11() {
		// Relayed in the stream loop where it can be (pump_linux.go),
		// which writes chunked framing: HTTP/1.1's.
		if b := s.pump().detach(x, resp, ctx.Conn()); b != nil {
			// The head is copied and the body taken: nothing of the
			// response is needed for the rest of the stream.
			fasthttp.ReleaseResponse(resp)
			body, resp = b, nil
		}
	}
	x.upc = nil
	r := newRelay(x, resp, body, f.strip)
	r.watch = w
	if c, ok := ctx.Conn().(*prefetchConn); ok { // our listener's; an embedder's server keeps its own write limits
		r.conn = c // the hijacked one replaces it (hijack.go)
	}
	w.retarget(r)
	releaseClientBody(ctx, x)
	if hj {
		s.hijackStream(ctx, r) // hijack.go
		return
	}
	ctx.Response.SetBodyStream(r, -1)
}

// releaseClientBody gives the client's request body back to fasthttp's pool
// once a stream has started: the engine has it, and holding it for the
// whole generation would cost a stream its prompt's size (a 32k-token
// prompt is ~100 KiB). A migration that resends the body as the client
// sent it keeps it; one that asked for token ids resends its own copy.
// Every string kept from the body was cloned (see openai.BytesView).
func releaseClientBody(ctx *fasthttp.RequestCtx, x *exchange) {
	if m := x.mig; m != nil && sameBacking(m.body, ctx.Request.Body()) {
		return
	}
	ctx.Request.ResetBody()
}

// readAtMost reads r to its end into buf, stopping once buf holds limit
// bytes (the caller's sign that the body is too long). io.LimitReader's
// reader would be one allocation a response more.
func readAtMost(buf *bytebufferpool.ByteBuffer, r io.Reader, limit int) error {
	for len(buf.B) < limit {
		if len(buf.B) == cap(buf.B) {
			buf.B = append(buf.B, 0)[:len(buf.B)]
		}
		n, err := r.Read(buf.B[len(buf.B):min(cap(buf.B), limit)])
		buf.B = buf.B[:len(buf.B)+n]
		switch {
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
	return nil
}

// sameBacking reports whether a and b are slices of one array (both
// reaching its end, as a body and its prefixes or suffixes do).
func sameBacking(a, b []byte) bool {
	return cap(a) > 0 && cap(b) > 0 && &a[:cap(a)][cap(a)-1] == &b[:cap(b)][cap(b)-1]
}

// respondWhole is actWhole on the goroutine path: it reads the answer's
// body (bounded, the client watched) and writes it (whole).
func (s *Server) respondWhole(f *flow, resp *fasthttp.Response, w *clientWatch) {
	defer w.stop()
	stream, _ := resp.BodyStream().(fasthttp.ReadCloserWithError)
	buf := bytebufferpool.Get()
	var err error
	if stream != nil {
		w.retarget(abortFunc(func(e error) { stream.CloseWithError(e) }))
		err = readAtMost(buf, stream, s.cfg.MaxResponseBytes+1)
		w.stop()
		if err == nil && buf.Len() > s.cfg.MaxResponseBytes {
			err = f.tooLarge()
		}
		stream.CloseWithError(err)
	} else {
		buf.Set(resp.Body())
	}
	if err != nil {
		bytebufferpool.Put(buf)
		fasthttp.ReleaseResponse(resp)
		f.bodyFailed(err)
		return
	}
	f.whole(resp, buf)
}

// whole writes the engine's whole answer, its head in resp and its body
// in buf, as the client's, on either path; a 200 that is not JSON is a
// broken upstream. The answer goes out first; its usage, metrics and log
// line follow (wholeBody.CloseWithError): step 7, off the client's wait.
// resp and buf are the answer's from here on.
func (f *flow) whole(resp *fasthttp.Response, buf *bytebufferpool.ByteBuffer) act {
	ctx, x := f.ctx, f.x
	status := resp.StatusCode()
	var members openai.ObjectMembers // a 200's, where its usage is
	if err := checkWhole(x, status, buf.B, &members); err != nil {
		bytebufferpool.Put(buf)
		fasthttp.ReleaseResponse(resp)
		return f.bodyFailed(err)
	}
	copyHeaders(ctx, resp, x)
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	fasthttp.ReleaseResponse(resp)
	ctx.SetStatusCode(status)
	wb := &wholeBody{x: x, buf: buf, status: status}
	if status == fasthttp.StatusOK {
		wb.setUsage(members.Member(buf.B, "usage"))
	}
	ctx.SetBodyStream(wb, buf.Len())
	return actAnswer
}

// checkWhole is a whole answer's check before it goes to the client: a
// 200 must be JSON (members notes its top level, where its usage is).
// The error is ErrUpstream's, for reject.
func checkWhole(x *exchange, status int, body []byte, members *openai.ObjectMembers) error {
	if status == fasthttp.StatusOK && openai.CheckJSONMembers(body, members) != nil {
		return fmt.Errorf("%w: %s returned a malformed JSON body", ErrUpstream, x.up.replica.Name())
	}
	return nil
}
