package proxy

import (
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// A stream is relayed on the client connection itself, taken over from
// fasthttp (Hijack) once its head is ready, rather than as a body fasthttp
// writes: fasthttp's serving goroutine then ends, and with it its deep
// call chain — parked under it, a waiting stream kept an 8 KiB stack where
// its own shallow one shrinks to less — and its write buffer, which it
// flushes and frees on hijack. The relay writes the chunked framing itself,
// one write(2) per read's worth of events as before. Measured with `bench
// proxy-cost`: 16.0–17.7 KiB per idle stream before, 10.4–10.8 after.
//
// When the stream ends the connection goes back to fasthttp (ServeConn) for
// the client's next request, unless the stream failed on the client side,
// either side asked to close, the router is draining, or the client has
// already sent bytes beyond this request (then fasthttp's hijacked reader
// holds them, and serving it would nest one wrapper per stream): such a
// connection is closed after its stream, as HTTP/1.1 lets a server do
// between responses.

// hijackable reports whether a stream on ctx can be relayed on its
// connection: a connection fasthttp got from the router's listener (a
// hijacked stream hands it back), and one still open. fasthttp clears the
// connection's deadlines before it runs the hijack and skips the hijack
// if that fails, which happens only on a closed connection; the relay
// would then never run nor release what the request holds, so such a
// stream takes fasthttp's body path, whose failed write closes the relay.
// Clearing the deadlines here first tells.
func hijackable(ctx *fasthttp.RequestCtx) bool {
	c, ok := ctx.Conn().(*prefetchConn)
	return ok && c.SetDeadline(time.Time{}) == nil
}

// hijackStream commits the head built on ctx.Response and relays r on the
// connection once the handler returns: in chunked framing to an HTTP/1.1
// client; unframed to an HTTP/1.0 one, which can't read chunks (RFC 9112
// §6.1: a server must not send them) and reads the stream to the
// connection's close (fasthttp's own body writer would chunk it).
func (s *Server) hijackStream(ctx *fasthttp.RequestCtx, r *relay) {
	served := ctx.Conn().(*prefetchConn)
	http11 := ctx.Request.Header.IsHTTP11()
	if http11 {
		ctx.Response.Header.SetContentLength(-1) // chunked
	} else {
		ctx.Response.Header.SetContentLength(-2) // neither length nor chunks; Connection: close
	}
	ctx.HijackSetNoResponse(true)
	s.streams.Add(1)
	ctx.Hijack(func(c net.Conn) {
		// fasthttp has set Connection: close by now where it would close
		// after the response: the client asked, or shutdown began.
		keep := !ctx.Response.Header.ConnectionClose()
		r.conn = c
		var err error
		if http11 {
			err = r.writeChunked(c, ctx.Response.Header.Header())
		} else {
			err = r.writeRaw(c, ctx.Response.Header.Header())
		}
		r.CloseWithError(err)
		s.streams.Add(-1)
		if err != nil || !keep || s.draining.Load() || pipelined(c, served) {
			c.Close() //nolint:errcheck // the stream is over either way
			return
		}
		s.serveKept(served)
	})
}

// serveKept serves the client's next requests on c, a connection whose
// stream is over, on fasthttp's path; fasthttp closes it when the client
// does, or keeps it (a later stream hijacks it again). Unless the router
// drains: c is closed.
func (s *Server) serveKept(c *prefetchConn) {
	if s.draining.Load() {
		c.Close() //nolint:errcheck
		return
	}
	s.kept.add(c)
	if s.draining.Load() { // Shutdown began since: its closeIdle may have run before add
		s.kept.remove(c)
		c.Close() //nolint:errcheck
		return
	}
	s.srv.ServeConn(c) //nolint:errcheck // fasthttp's own log
}

// keptConns are the connections handed back to fasthttp after a stream.
// fasthttp's Shutdown closes its idle connections at once but for one
// served through ServeConn, which it counts as new — idle only 5 s later —
// so Shutdown closes those itself when they wait for a request (idle).
type keptConns struct {
	mu  sync.Mutex
	set map[*prefetchConn]struct{}
}

// prefetchConn's state as a kept connection (connState).
type keptState struct {
	kept atomic.Bool // in keptConns
	idle atomic.Bool // waiting for the client's next request
}

func (k *keptConns) add(c *prefetchConn) {
	c.state.idle.Store(true)
	c.state.kept.Store(true)
	k.mu.Lock()
	if k.set == nil {
		k.set = make(map[*prefetchConn]struct{})
	}
	k.set[c] = struct{}{}
	k.mu.Unlock()
}

// closeIdle closes every kept connection waiting for a request.
func (k *keptConns) closeIdle() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for c := range k.set {
		if c.state.idle.Load() {
			c.Close() //nolint:errcheck // its serving goroutine sees it and ends
			delete(k.set, c)
		}
	}
}

// connState is fasthttp's ConnState hook: it follows kept connections
// (two atomic loads per request on any other).
func (s *Server) connState(nc net.Conn, st fasthttp.ConnState) {
	c, ok := nc.(*prefetchConn)
	if !ok || !c.state.kept.Load() {
		return
	}
	switch st {
	case fasthttp.StateActive:
		c.state.idle.Store(false)
	case fasthttp.StateIdle:
		c.state.idle.Store(true)
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		s.kept.remove(c)
	}
}

func (k *keptConns) remove(c *prefetchConn) {
	c.state.kept.Store(false)
	k.mu.Lock()
	delete(k.set, c)
	k.mu.Unlock()
}

// writeChunked writes head, then the stream's events in chunked framing
// (WriteTo's loop, each read's worth as one chunk), then the last chunk —
// in the same write as the last events when they are written at the end —
// each write within the idle timeout (armWrite). An error means the client
// is gone.
func (r *relay) writeChunked(w io.Writer, head []byte) error {
	defer r.disarmWrite()
	if err := r.writeHead(w, head); err != nil {
		return err
	}
	// In the stream loop while it can be (pump_linux.go), then here.
	if err := r.pumpStream(w); err != nil {
		return err
	}
	return r.writeChunks(w)
}

// writeChunks is writeChunked's relay after the head: the events as they
// come, then the last chunk.
func (r *relay) writeChunks(w io.Writer) error {
	cw := chunkWriter{w: w, r: r}
	if _, err := r.WriteTo(&cw); err != nil || cw.ended {
		return err
	}
	if err := r.armWrite(); err != nil {
		return err
	}
	_, err := io.WriteString(w, lastChunk)
	return err
}

// writeRaw writes head, then the stream's events as they come, for a
// client that reads the stream to the connection's close (HTTP/1.0).
func (r *relay) writeRaw(w io.Writer, head []byte) error {
	defer r.disarmWrite()
	if err := r.writeHead(w, head); err != nil {
		return err
	}
	_, err := r.WriteTo(w)
	return err
}

// writeHead writes the response head within the idle timeout.
func (r *relay) writeHead(w io.Writer, head []byte) error {
	if err := r.armWrite(); err != nil {
		return err
	}
	_, err := w.Write(head)
	return err
}

// chunkWriter writes each Write as one chunk (writeChunk), and once the
// relay is at its end (eof: the Write holds its last events) the last
// chunk with it.
type chunkWriter struct {
	w     io.Writer
	r     *relay
	ended bool // the last chunk is written
}

func (c *chunkWriter) Write(b []byte) (int, error) {
	var last string
	if c.r.eof {
		last, c.ended = lastChunk, true
	}
	if err := writeChunk(c.w, b, last); err != nil {
		return 0, err
	}
	return len(b), nil
}

// lastChunk ends a chunked body (no trailers).
const lastChunk = "0\r\n\r\n"

// writeChunk writes b as one chunk (none when b is empty), then last, in
// one write, framed in a pooled buffer.
func writeChunk(w io.Writer, b []byte, last string) error {
	p := relayBufs.Get().(*[]byte)
	buf := (*p)[:0]
	if len(b) > 0 {
		buf = strconv.AppendInt(buf, int64(len(b)), 16)
		buf = append(buf, "\r\n"...)
		buf = append(buf, b...)
		buf = append(buf, "\r\n"...)
	}
	buf = append(buf, last...)
	_, err := w.Write(buf)
	putRelayBuf(&p, buf, nil)
	return err
}

// pipelined reports whether the client sent bytes after its request that
// the connection's reader holds. At the front door (served's), they wait
// in served's read-ahead buffer, unread: reading them would take the next
// request's head. Elsewhere, fasthttp's hijacked reader (c) holds them:
// reading with a deadline already past returns them at once and touches
// no socket (a deadline in the past fails a read before any system call).
// Such a connection is not handed back (hijackStream); a byte read here
// is lost with it.
func pipelined(c net.Conn, served *prefetchConn) bool {
	if served.door != nil {
		return len(served.unread()) > 0
	}
	if err := c.SetReadDeadline(time.Unix(1, 0)); err != nil {
		return true
	}
	var b [1]byte
	n, _ := c.Read(b[:])
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return true
	}
	return n > 0
}
