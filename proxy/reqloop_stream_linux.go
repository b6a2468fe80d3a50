//go:build linux

package proxy

import (
	"io"
	"net"
	"sync"

	"github.com/gpurouter/gpurouter/internal/netloop"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// A stream on the request loop (docs/dataplane-loop.md, "Streams on the
// request loop"). On fasthttp's path a stream cost the router about three
// times nginx's CPU to set up and end — a goroutine that parses the
// request again, fasthttp's client, the engine's socket taken out of Go's
// netpoller at every stream and put back after it, a hijack goroutine —
// a microsecond of every event of a 100-event stream. The loop takes a
// stream's request as a whole request's, through the same steps (start,
// place, attempt), and once the engine's head is in it writes the
// client's head and relays the events itself: both sockets stay in its
// set, and the loop's own stream relay (l.host, a streamPump run by the
// loop: host, pull, expire, release) does per event what a stream loop
// does. A stream that ends cleanly is finished there — its last events
// and the last chunk written, its engine connection kept for the next
// request, its client's next request read (streamBack) — without a
// goroutine, a system call for Go's netpoller or for an epoll set, or a
// descriptor duplicated.
//
// Anything else that ends a stream's relay on the loop — a client whose
// socket is full, an engine that fails (a migration may follow), a
// timeout, a hang-up, the loop stopping — goes to a goroutine that relays
// the rest as fasthttp's path does (streamOnGoroutine): the client's
// connection then stays on that path, as a hijacked stream's does.

// streamsOnLoop reports whether the loop relays its streams' events:
// unless every stream is to run on a goroutine (upstream.goroutine_streams,
// streamOnGoroutine).
func (l *requestLoop) streamsOnLoop() bool {
	return !l.s.cfg.GoroutineStreams
}

// streamHead takes the stream whose head has come whole on u, for c's
// request: true when the engine answered with an event stream, which the
// loop (or a goroutine) relays from now on; false leaves it to the
// loop's whole answer (an error, or JSON for a stream asked).
func (l *requestLoop) streamHead(c *loopConn, u *loopConn) bool {
	r, s := c.r, l.s
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	l.rd.Reset(u.in.B[u.headAt:u.headLen])
	l.br.Reset(&l.rd)
	if resp.Header.Read(l.br) != nil || resp.StatusCode() != fasthttp.StatusOK || !isEventStream(resp) {
		return false
	}
	f := &r.f
	x, ctx := f.x, f.ctx
	f.answered(resp) // a 200 event stream: actStream, always
	r.phase = phaseStreaming
	streamHead(ctx, resp, x)
	ctx.Response.Header.SetContentLength(-1) // chunked
	r.closing = ctx.Request.Header.ConnectionClose() || s.draining.Load()
	if r.closing {
		ctx.Response.SetConnectionClose()
	}
	if name := s.serverName(); name != "" && len(ctx.Response.Header.Server()) == 0 {
		ctx.Response.Header.SetServer(name)
	}
	head := ctx.Response.Header.Header()
	if len(c.out) > 0 {
		// An answer to a request pipelined before this one still waits
		// for the socket: it goes first.
		head = append(c.out, head...)
		c.out = nil
		l.rewatch(c, unix.EPOLLIN|unix.EPOLLRDHUP) // no longer waiting to write
	}

	l.size.Add(-1) // a stream is counted in s.streams, as a hijacked one
	s.streams.Add(1)
	u.peer, r.u = nil, nil
	stash := append([]byte(nil), u.in.B[u.headLen:]...)
	bytebufferpool.Put(u.in)
	u.in = nil
	releaseClientBody(ctx, x)

	var body fasthttp.ReadCloserWithError
	var b *detachedBody
	if resp.Header.ContentLength() == -1 {
		b = &detachedBody{
			pump: l.host, stash: stash, clientFD: c.fd, cfd: -1, fd: u.fd,
			to: &s.to, cap: &f.up.cap,
			laddr: u.addrs.laddr, raddr: u.addrs.raddr,
			deadline: r.sentAt.Add(s.to.firstByte), // the first byte's, running since the request went
		}
		b.write = b.writeFrame
		if !resp.ConnectionClose() {
			b.reuse = &f.up.idle // should the goroutine path end it
		}
		body = b
	} else {
		// Framed by its length or its connection's close (HTTP/1.0): the
		// goroutine path's reader relays it.
		body = &plainBody{fd: u.fd, stash: stash, left: resp.Header.ContentLength(), up: u.addrs,
			to: &s.to, cap: &f.up.cap}
	}
	rl := newRelay(x, nil, body, f.strip)
	if b != nil {
		b.r = rl
	}

	n, err := netloop.Write(c.fd, head)
	if err != nil && err != unix.EAGAIN && err != unix.EINTR {
		n = 0 // the goroutine's write fails the same way, and ends the stream as the client's
	}
	n = max(n, 0)
	if n < len(head) || b == nil || !l.streamsOnLoop() {
		l.streamOnGoroutine(c, u, r, rl, pumpResult{}, append([]byte(nil), head[n:]...))
		return true
	}
	// Both sockets stay in the set, their events the stream's now
	// (readUpstream, readClient).
	u.stream, r.stream = b, b
	b.onBack = func(res pumpResult) { l.streamBack(c, u, r, rl, b, res) }
	l.host.host(b, l.now)
	return true
}

// streamBack takes c's stream back from the loop's stream relay (res:
// why it stopped): a clean end is finished here, anything else on a
// goroutine.
func (l *requestLoop) streamBack(c *loopConn, u *loopConn, r *loopReq, rl *relay, b *detachedBody, res pumpResult) {
	u.stream, r.stream = nil, nil
	clean := res.readErr == io.EOF && res.clientErr == nil && !res.leaving && len(res.unsent) == 0 &&
		rl.sawDone && !rl.eof && rl.abortErr.Load() == nil && c.fd >= 0
	if !clean {
		l.streamOnGoroutine(c, u, r, rl, res, nil)
		return
	}
	l.size.Add(1)
	c.since = l.now
	rl.afterRead(io.EOF) // the end, after [DONE]: eof
	// The last events and the last chunk in one write, as writeChunked
	// writes them (what the socket does not take waits for EPOLLOUT).
	l.w.c = c
	err := writeChunk(&l.w, rl.out[rl.outPos:], lastChunk)
	rl.out, rl.outPos = rl.out[:0], 0
	// The engine's connection carries the replica's next request, unless
	// the engine said it closes it or sent past the end.
	b.mu.Lock()
	reuse := b.reuse != nil && b.dec.Done() && len(b.stash) == 0 && !b.extra && b.fd == u.fd
	if reuse {
		b.closed, b.fd = true, -1
	}
	b.mu.Unlock()
	if reuse {
		u.end.Reset()
		l.putIdle(u)
	} else {
		l.unhost(u, b.owns(u.fd))
	}
	if err != nil {
		err = &streamWriteError{err}
	}
	rl.CloseWithError(err) // the exchange finishes: step 7
	l.s.streams.Add(-1)
	c.r = nil
	l.done(c, r, err, r.closing)
}

// abortStream ends r's stream for cause, as the client watch would: the
// client left, or the loop stops.
func (l *requestLoop) abortStream(r *loopReq, cause error) {
	if b := r.stream; b != nil && b.in {
		b.r.abort(cause)
		l.host.release(b, pumpResult{}, exitAborted)
	}
}

// scanStreams ends the loop's streams past a deadline (streamPump.expire:
// first byte, idle, total), or every one once the drain's deadline has
// passed, as their client watches would.
func (l *requestLoop) scanStreams(aborting bool) {
	if !aborting {
		l.host.expire(l.now)
		return
	}
	for _, b := range l.host.streams.By {
		if b != nil {
			b.r.abort(errDrainPassed)
			l.host.release(b, pumpResult{}, exitAborted)
		}
	}
}

// stopStreams gives the loop's streams to goroutines as the loop stops:
// they go on there (streamOnGoroutine).
func (l *requestLoop) stopStreams() {
	for _, b := range l.host.streams.By {
		if b != nil {
			l.host.release(b, pumpResult{}, exitStopped)
		}
	}
}

// unhost lets go of a stream's engine connection, which its body is to
// close, or reads on a goroutine from now on: the loop forgets it. open:
// the socket is still open (its descriptor still u's), so it leaves the
// set; else the body closed it already (handBack). Either way the body
// takes it off the replica's count when it closes it.
func (l *requestLoop) unhost(u *loopConn, open bool) {
	if u.fd < 0 {
		return
	}
	if open {
		unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, u.fd, nil) //nolint:errcheck // a goroutine's, or closed, either way
	}
	if l.conns.Get(u.fd) == u {
		l.conns.Del(u.fd)
	}
	u.fd = -1
}

// streamWriteError is a failed write of a stream's end to its client.
type streamWriteError struct{ err error }

func (e *streamWriteError) Error() string { return "write: " + e.err.Error() }
func (e *streamWriteError) Unwrap() error { return e.err }

// streamOnGoroutine relays the rest of c's stream on a goroutine, as a
// hijacked stream is (hijack.go): from where the stream loop handed it
// back (res), after the head's bytes the client's socket did not take
// (head). The client's connection and the engine's go to Go's netpoller
// and stay on fasthttp's path; the loop forgets them, and the request's
// context, which the stream keeps (a migration reads its headers).
func (l *requestLoop) streamOnGoroutine(c *loopConn, u *loopConn, r *loopReq, rl *relay, res pumpResult, head []byte) {
	s := l.s
	if l.conns.Get(c.fd) == c {
		l.conns.Del(c.fd)
	}
	unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, c.fd, nil) //nolint:errcheck // Go's netpoller's from now on
	// A plainBody's socket is closed by its reader only.
	open := true
	if b, ok := rl.body.(*detachedBody); ok {
		open = b.owns(u.fd)
	}
	l.unhost(u, open)
	pc := newPrefetchConn(netloop.NewFileConn(c.fd, c.addrs.laddr, c.addrs.raddr), &s.conns, s.door)
	c.fd, c.r, c.req = -1, nil, nil
	closing := r.closing
	if c.in != nil {
		// Requests the client sent behind the stream's: fasthttp's path
		// can't be given them, so the connection closes after the stream,
		// as a hijacked one with its next request read does.
		closing = true
		bytebufferpool.Put(c.in)
		c.in = nil
	}
	if m := rl.x.mig; m != nil {
		m.client = pc // its context's connection is the loop's, not one to watch
	}
	go func() {
		rl.conn = pc
		rl.watch = s.startWatch(rl.x, pc, rl)
		var err error
		if len(head) > 0 {
			err = rl.writeHead(pc, head)
		}
		if err == nil {
			err = rl.afterPump(pc, res)
		}
		if err == nil {
			err = rl.writeChunks(pc)
		}
		rl.disarmWrite()
		rl.CloseWithError(err)
		s.streams.Add(-1)
		if err != nil || closing {
			pc.Close() //nolint:errcheck // the stream is over either way
			return
		}
		s.serveKept(pc)
	}()
}

// plainBody is an engine's event stream framed by its length or by its
// connection's close (an HTTP/1.0 engine's), for the goroutine relay: the
// bytes read with the head, then the socket's, through Go's netpoller
// with the first-byte and idle deadlines fasthttp's reads have.
type plainBody struct {
	stash   []byte
	left    int // bytes to come, the stash's included; -1: to the close
	up      loopAddrs
	to      *timeouts
	cap     *connCap // the replica's connection count, which the socket leaves when it closes
	gotBody bool

	mu     sync.Mutex // orders the socket's wrapping against a close from the watch (relay.abort)
	fd     int        // the socket until conn wraps it; -1 then, or once closed
	conn   net.Conn
	closed bool
}

func (p *plainBody) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	if p.left > 0 && len(b) > p.left {
		b = b[:p.left]
	}
	var n int
	var err error
	if len(p.stash) > 0 {
		n = copy(b, p.stash)
		p.stash = p.stash[n:]
	} else {
		c, cerr := p.netConn()
		if cerr != nil {
			return 0, cerr
		}
		n, err = c.Read(b)
	}
	if n > 0 {
		p.gotBody = true
		if p.left > 0 {
			p.left -= n
		}
	}
	return n, err
}

// netConn wraps the socket for Go's netpoller, once (upstreamConn);
// net.ErrClosed once the relay has closed the body.
func (p *plainBody) netConn() (net.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, net.ErrClosed
	}
	if p.conn == nil {
		p.conn = upstreamConn(p.fd, p.up.laddr, p.up.raddr, p.to, p.cap, p.gotBody)
		p.fd = -1
	}
	return p.conn, nil
}

// CloseWithError closes the engine's connection: it carries no other
// response.
func (p *plainBody) CloseWithError(error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.conn != nil {
		return p.conn.Close()
	}
	if p.fd >= 0 {
		unix.Close(p.fd)
		p.fd = -1
		p.cap.give()
	}
	return nil
}
