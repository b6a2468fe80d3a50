//go:build linux

package proxy

import (
	"fmt"
	"net"
	"time"

	"github.com/gpurouter/gpurouter/internal/h1"
	"github.com/gpurouter/gpurouter/internal/netloop"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// loopConn is a socket of a request loop: a client's (up nil) or an
// engine's.
type loopConn struct {
	fd      int
	addrs   loopAddrs                  // its addresses, as its requests' contexts give them
	in      *bytebufferpool.ByteBuffer // bytes read and not yet used; nil when none
	out     []byte                     // bytes the socket has not taken yet
	since   time.Time                  // a client's: its request's first byte, else its last response; an engine's: idle since
	closing bool                       // a client's: close once out is written
	serving bool                       // a client's: serve is reading its requests
	wrote   time.Time                  // out last took bytes (or began to wait)
	batched bool                       // out is kept for the read batch's writes (requestLoop.keep)
	reading bool                       // a read of it is in the wake-up's batch (queueRead)

	// A client's request in progress (req); nil between requests.
	r   *loopReq
	req *loopReq

	// An engine's.
	up      *upstream
	stream  *detachedBody  // the stream it carries, relayed by the loop (reqloop_stream_linux.go); nil if none
	peer    *loopConn      // the client whose request it carries; nil while idle
	end     h1.ResponseEnd // where the response in progress ends
	reused  bool           // it has carried a response before: an engine may have closed it meanwhile
	head    bool           // the response's head is in
	headAt  int            // where it starts: past interim (1xx) heads
	headLen int            // where it ends (the body's start), once in
	extra   bool           // bytes came past the response's end: the connection can't carry another
	toClose bool           // the response runs to the connection's close (HTTP/1.0, no length)
	toLen   int            // a toClose response's Content-Length once its head is in (an HTTP/1.0 one may give it); -1: none, read to the close
	last    time.Time      // the last read of the response in progress
}

// readClient reads what a client sent and serves the requests it
// completes.
func (l *requestLoop) readClient(c *loopConn) {
	n, err := netloop.Read(c.fd, l.buf)
	l.clientRead(c, l.buf, n, err)
}

// clientRead serves what a read of c's socket gave: n bytes at the start
// of buf (the loop's read buffer, or the batch's slot for c), or err.
func (l *requestLoop) clientRead(c *loopConn, buf []byte, n int, err error) {
	if err == unix.EAGAIN || err == unix.EINTR {
		return
	}
	if n <= 0 {
		l.clientGone(c)
		return
	}
	if c.in == nil && c.r == nil {
		// A request that comes whole in one read, the usual case, is
		// served from the read buffer: no copy, no buffer held.
		c.since = l.now
		l.serve(c, buf[:n])
		return
	}
	if c.in == nil {
		c.in = bytebufferpool.Get()
	}
	c.in.Write(buf[:n]) //nolint:errcheck
	if c.r != nil {
		// Sent while its last request is in progress (pipelined): served
		// next, within the limits of one request.
		if c.in.Len() > l.s.cfg.MaxHeaderBytes+l.s.cfg.MaxBodyBytes {
			l.clientGone(c)
		}
		return
	}
	l.serve(c, c.in.B)
}

// serve serves the requests at the start of b — c.in's bytes, or a read's
// still in the read buffer — while they are whole and c is free for them,
// and keeps what is left in c.in.
func (l *requestLoop) serve(c *loopConn, b []byte) {
	c.serving = true // a request answered at once must not serve b again (respond)
	defer func() { c.serving = false }()
	for len(b) > 0 && c.r == nil && !c.closing && c.fd >= 0 {
		n, served := l.serveOne(c, b)
		if !served {
			return // handed off with b
		}
		if n == 0 {
			break // not whole yet
		}
		b = b[n:]
	}
	if c.fd >= 0 {
		c.keep(b)
	}
}

// serveOne serves the request at the start of b once it is whole: n is
// its length (0 while it is not whole); served is false when c was handed
// off with b (or closed) instead.
func (l *requestLoop) serveOne(c *loopConn, b []byte) (n int, served bool) {
	if len(c.out) > 0 {
		// The last answer is not all out: the next request waits for it
		// (drained), since one handed off takes the connection, and
		// the answer's rest with it.
		return 0, true
	}
	// The request grammar, before anything acts on the request: a
	// request it refuses is answered and its connection closed, never
	// handed on (frontdoor.go).
	r, err := h1.ParseRequest(b, l.s.door.lim)
	switch {
	case err != nil:
		l.refuse(c, err)
		return 0, false
	case !r.Complete():
		return 0, true
	case r.Chunked(): // fasthttp's path takes it, decoded at its front door
		l.handOff(c, b)
		return 0, false
	case r.Length > int64(l.s.cfg.MaxBodyBytes):
		l.handOff(c, b) // 413, from fasthttp
		return 0, false
	}
	head, n := r.HeadEnd, r.HeadEnd+int(r.Length)
	ctx := l.acquireCtx(c)
	l.rd.Reset(b[r.Start:head])
	l.br.Reset(&l.rd)
	if err := ctx.Request.Header.Read(l.br); err != nil {
		// Not a head the grammar takes and fasthttp does not (the grammar
		// is fuzzed against fasthttp's reading): the client gets the same
		// answer as for any other.
		l.releaseCtx(ctx)
		l.refuse(c, errHeadUnread)
		return 0, false
	}
	if !l.fits(ctx) {
		l.releaseCtx(ctx)
		l.handOff(c, b)
		return 0, false
	}
	if n > len(b) {
		l.releaseCtx(ctx) // the body is still coming: parsed again once it is in
		return 0, true
	}
	ctx.Request.SetBody(b[head:n])
	if !l.start(c, ctx, b) {
		return 0, false
	}
	return n, true
}

// fits reports a request the loop serves, by its head: an API call by
// POST over HTTP/1.1 with its body's length given and nothing asked of
// the connection.
func (l *requestLoop) fits(ctx *fasthttp.RequestCtx) bool {
	h := &ctx.Request.Header
	return h.IsPost() && h.IsHTTP11() && h.ContentLength() >= 0 && len(h.Peek("Expect")) == 0 &&
		!h.ConnectionUpgrade() && len(h.Peek("Upgrade")) == 0
}

// acquireCtx is a request context for a request of c.
func (l *requestLoop) acquireCtx(c *loopConn) *fasthttp.RequestCtx {
	var ctx *fasthttp.RequestCtx
	if n := len(l.ctxs); n > 0 {
		ctx = l.ctxs[n-1]
		l.ctxs = l.ctxs[:n-1]
	} else {
		ctx = new(fasthttp.RequestCtx)
	}
	ctx.Init2(&c.addrs, fasthttpLogger{l.s.log}, true)
	return ctx
}

func (l *requestLoop) releaseCtx(ctx *fasthttp.RequestCtx) {
	ctx.Request.Reset()
	ctx.Response.Reset()
	if len(l.ctxs) < maxLoopCtxs {
		l.ctxs = append(l.ctxs, ctx)
	}
}

// maxLoopCtxs bounds the spare request contexts a loop keeps (each ~2 KiB).
const maxLoopCtxs = 256

// keep makes b — the tail of c.in's bytes, or of a read's — what c holds
// for its next request.
func (c *loopConn) keep(b []byte) {
	switch {
	case len(b) == 0:
		if c.in != nil {
			bytebufferpool.Put(c.in)
			c.in = nil
		}
	case c.in != nil && sameBacking(b, c.in.B):
		c.in.B = c.in.B[:copy(c.in.B, b)]
	default:
		if c.in == nil {
			c.in = bytebufferpool.Get()
		}
		c.in.Reset()
		c.in.Write(b) //nolint:errcheck
	}
}

// respond writes the response in ctx to c — as fasthttp's server would:
// the answer goes out first, then closing a whole answer's body finishes
// its exchange (wholeBody) — and goes on to c's next request.
func (l *requestLoop) respond(c *loopConn) {
	r := c.r
	c.r = nil // the exchange is the response's now: a failed write ends it (wholeBody)
	ctx := r.f.ctx
	if ctx.Request.Header.ConnectionClose() || l.s.draining.Load() {
		ctx.Response.SetConnectionClose()
	}
	if name := l.s.serverName(); name != "" && len(ctx.Response.Header.Server()) == 0 {
		ctx.Response.Header.SetServer(name) // as fasthttp's server does
	}
	l.w.c = c
	l.bw.Reset(&l.w)
	err := ctx.Response.Write(l.bw)
	if err == nil {
		err = l.bw.Flush()
	}
	l.done(c, r, err, ctx.Response.ConnectionClose())
}

// done ends c's request r once its answer is written (err: why that
// failed; closing: the answer said Connection: close), and goes on to c's
// next request.
func (l *requestLoop) done(c *loopConn, r *loopReq, err error, closing bool) {
	c.closing = closing
	l.releaseCtx(r.f.ctx)
	l.releaseReq(r)
	c.since = l.now
	switch {
	case err != nil:
		l.closeClient(c)
	case c.closing && len(c.out) == 0:
		l.closeClient(c)
	case c.in != nil && !c.serving:
		l.serve(c, c.in.B)
	}
}

// loopWriter writes to a client's socket without blocking: what it does
// not take now waits in c.out for EPOLLOUT (writable).
type loopWriter struct {
	l *requestLoop
	c *loopConn
}

func (w *loopWriter) Write(p []byte) (int, error) {
	c := w.c
	if c.fd < 0 {
		return 0, errLoopConn
	}
	if w.l.keep(c, p) {
		return len(p), nil // written with the batch's (flushWrites)
	}
	if len(c.out) == 0 {
		n, err := netloop.Write(c.fd, p)
		if err != nil && err != unix.EAGAIN && err != unix.EINTR {
			return 0, err
		}
		n = max(n, 0)
		if n == len(p) {
			return n, nil
		}
		c.wrote = w.l.now
		w.l.rewatch(c, unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLOUT)
		c.out = append(c.out, p[n:]...)
		return len(p), nil
	}
	c.out = append(c.out, p...)
	return len(p), nil
}

// send writes b to c (an engine's socket) at once, keeping what it does
// not take for when it is writable; false when c failed (and was closed).
func (l *requestLoop) send(c *loopConn, b []byte) bool {
	w := loopWriter{l: l, c: c}
	if _, err := w.Write(b); err != nil {
		l.closeConn(c)
		return false
	}
	return true
}

// writable writes what c holds; false when c failed or closed.
func (l *requestLoop) writable(c *loopConn) bool {
	if len(c.out) == 0 {
		return true
	}
	n, err := netloop.Write(c.fd, c.out)
	if err != nil && err != unix.EAGAIN && err != unix.EINTR {
		l.closeConn(c)
		return false
	}
	if n > 0 {
		c.wrote = l.now
	}
	c.out = c.out[max(n, 0):]
	if len(c.out) > 0 {
		return true
	}
	c.out = nil
	l.rewatch(c, unix.EPOLLIN|unix.EPOLLRDHUP)
	return l.drained(c)
}

// drained goes on with c once its socket has taken all it held: a client
// told Connection: close is closed (false), one with a request pipelined
// behind the answer has it served (serveOne waits for this).
func (l *requestLoop) drained(c *loopConn) bool {
	switch {
	case c.up != nil:
	case c.closing:
		l.closeClient(c)
		return false
	case c.r == nil && !c.serving && c.in != nil && c.in.Len() > 0:
		l.serve(c, c.in.B)
		return c.fd >= 0
	}
	return true
}

func (l *requestLoop) rewatch(c *loopConn, ev uint32) {
	unix.EpollCtl(l.ep, unix.EPOLL_CTL_MOD, c.fd, &unix.EpollEvent{Events: ev, Fd: int32(c.fd)}) //nolint:errcheck
}

func (l *requestLoop) closeConn(c *loopConn) {
	if c.up != nil {
		l.upstreamGone(c)
		return
	}
	l.clientGone(c)
}

// clientGone is a client that hung up or failed: its request in progress
// ends as the client watch would end it (watch.go).
func (l *requestLoop) clientGone(c *loopConn) {
	if c.r != nil {
		l.abort(c, fmt.Errorf("%w: connection closed by client", ErrClientGone))
	}
	l.closeClient(c)
}

// closeClient closes c and forgets it.
func (l *requestLoop) closeClient(c *loopConn) {
	if c.fd < 0 {
		return
	}
	l.forget(c)
	l.size.Add(-1)
	l.s.conns.Add(-1)
}

// forget closes c's socket (its descriptor leaves the set with it) and
// drops what it holds.
func (l *requestLoop) forget(c *loopConn) {
	if l.conns.Get(c.fd) == c {
		l.conns.Del(c.fd)
	}
	unix.Close(c.fd)
	c.fd = -1
	if c.in != nil {
		bytebufferpool.Put(c.in)
		c.in = nil
	}
	c.out = nil
}

// handOff gives c, with b, the bytes read from it and not yet served, to
// fasthttp's server:
// what the loop does not serve. Nothing of the request was acted on.
func (l *requestLoop) handOff(c *loopConn, b []byte) {
	l.conns.Del(c.fd)
	unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, c.fd, nil) //nolint:errcheck
	l.size.Add(-1)
	pc := newPrefetchConn(netloop.NewFileConn(c.fd, c.addrs.laddr, c.addrs.raddr), &l.s.conns, l.s.door)
	if len(b) > 0 {
		// A buffer of the prefetch pool, which the connection gives back
		// once it has read it: a stream handed off holds none.
		pb := prefetchBufs.Get().(*[]byte)
		if len(b) > len(*pb) {
			prefetchBufs.Put(pb)
			nb := make([]byte, len(b))
			pb = &nb
		}
		pc.buf, pc.r, pc.w = pb, 0, copy(*pb, b)
	}
	if c.in != nil {
		bytebufferpool.Put(c.in)
		c.in = nil
	}
	c.fd = -1
	l.s.m.loopHandOffs.Inc()
	go l.s.srv.ServeConn(pc) //nolint:errcheck // fasthttp logs and closes
}

// errHeadUnread is a head the request grammar took and fasthttp could not
// read: a request refused all the same.
var errHeadUnread = fmt.Errorf("%w: a head fasthttp cannot read", h1.ErrMalformed)

// refuse answers a request the grammar refused (err) and closes its
// connection, as the front door on fasthttp's path does: off the loop, on
// a goroutine that writes the answer, lingers while the client may still
// be sending, and closes (prefetchConn.refuse).
func (l *requestLoop) refuse(c *loopConn, err error) {
	l.conns.Del(c.fd)
	unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, c.fd, nil) //nolint:errcheck
	l.size.Add(-1)
	pc := newPrefetchConn(netloop.NewFileConn(c.fd, c.addrs.laddr, c.addrs.raddr), &l.s.conns, l.s.door)
	if c.in != nil {
		bytebufferpool.Put(c.in)
		c.in = nil
	}
	c.fd = -1
	go pc.refuse(err) //nolint:errcheck // the connection is closed either way
}

// requestTimeout answers a client whose request did not arrive within
// the read timeout (slowloris), as fasthttp would, and closes it.
func (l *requestLoop) requestTimeout(c *loopConn) {
	ctx := l.acquireCtx(c)
	writeError(ctx, l.s.to.requestLate())
	ctx.Response.SetConnectionClose()
	l.w.c = c
	l.bw.Reset(&l.w)
	if ctx.Response.Write(l.bw) == nil {
		l.bw.Flush() //nolint:errcheck // best effort: the client is slow or gone
	}
	l.releaseCtx(ctx)
	l.closeClient(c)
}

// loopAddrs is what a request context asks of its connection on the loop:
// its addresses (the client's IP for X-Forwarded-For).
type loopAddrs struct{ laddr, raddr net.Addr }

func (a *loopAddrs) LocalAddr() net.Addr              { return a.laddr }
func (a *loopAddrs) RemoteAddr() net.Addr             { return a.raddr }
func (a *loopAddrs) Read([]byte) (int, error)         { return 0, errLoopConn }
func (a *loopAddrs) Write([]byte) (int, error)        { return 0, errLoopConn }
func (a *loopAddrs) Close() error                     { return nil }
func (a *loopAddrs) SetDeadline(time.Time) error      { return nil }
func (a *loopAddrs) SetReadDeadline(time.Time) error  { return nil }
func (a *loopAddrs) SetWriteDeadline(time.Time) error { return nil }

var errLoopConn = fmt.Errorf("proxy: the request loop's connection is not read or written through its context")
