//go:build linux

package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/internal/h1"
	"github.com/gpurouter/gpurouter/internal/netloop"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// upstreamWire writes the head of the request the replicas are sent, as
// upstreamRequest builds it for fasthttp's client: the same method, path
// and headers (forwardedHeaders, routerHeaders), the length of the flow's
// body; the Host line follows per replica (sendRequest). The same headers,
// not in the same order: an engine reads them by name.
func (l *requestLoop) upstreamWire(r *loopReq) {
	f := &r.f
	b := append(append(append(r.wire[:0], "POST "...), f.x.ep.Path()...), " HTTP/1.1\r\n"...)
	forwardedHeaders(&f.ctx.Request.Header, f.x, func(k, v []byte) {
		b = append(append(append(append(b, k...), ": "...), v...), "\r\n"...)
	})
	var own [128]byte
	seq, xff := l.s.routerHeaders(f.ctx, f.x, own[:0])
	b = append(append(append(b, "X-Request-Id: "...), f.x.id...), "\r\n"...)
	b = append(append(append(append(append(b, seqHeader...), ": "...), seq...), "\r\nX-Forwarded-For: "...), xff...)
	b = append(b, "\r\n"...)
	b = strconv.AppendInt(append(b, "Content-Length: "...), int64(len(f.body)), 10)
	r.wire, r.head = append(b, "\r\n"...), len(b)+2
}

// sendRequest is actSend on the loop: c's request to the replica its
// flow leased, on an idle keep-alive connection of the loop's, else on
// one dialed for it. The head is written once, for the first attempt.
func (l *requestLoop) sendRequest(c *loopConn) {
	r := c.r
	if len(r.wire) == 0 {
		l.upstreamWire(r)
	}
	r.wire = append(append(append(r.wire[:r.head], "Host: "...), r.f.rep.Addr()...), "\r\n"...)
	// The attempt's span, the engine's parent (nothing while tracing is
	// off: the client's traceparent went with its headers).
	r.wire = r.f.x.tr.AppendHeaderLines(r.wire)
	r.wire = append(append(r.wire, "\r\n"...), r.f.body...)
	r.sentAt = l.now
	r.phase = phaseAwaiting
	if u := l.takeIdle(r.f.up); u != nil {
		l.sendOn(c, u)
		return
	}
	l.dial(c)
}

// sendOn writes c's request on u.
func (l *requestLoop) sendOn(c *loopConn, u *loopConn) {
	r := c.r
	r.u, u.peer = u, c
	u.end.Reset()
	u.head, u.toClose, u.toLen, u.last = false, false, -1, l.now
	r.f.x.tr.AttemptConnected(l.now)
	if !l.send(u, r.wire) {
		return // upstreamGone has judged it
	}
}

// takeIdle is up's most recently used idle connection in the loop, nil
// when none.
func (l *requestLoop) takeIdle(up *upstream) *loopConn {
	idle := l.idle[up]
	if len(idle) == 0 {
		return nil
	}
	u := idle[len(idle)-1]
	idle[len(idle)-1] = nil
	l.idle[up] = idle[:len(idle)-1]
	return u
}

// putIdle keeps u for up's next request — unless the replica has its
// cap's worth of connections (conncap.go): then u closes, so that the
// goroutine path, which can't take the loop's idle ones, may dial.
func (l *requestLoop) putIdle(u *loopConn) {
	if u.up.cap.full() {
		u.peer = nil
		l.closeUpstream(u)
		return
	}
	u.peer, u.reused, u.since = nil, true, l.now
	l.idle[u.up] = append(l.idle[u.up], u)
}

// dial connects to c's replica on a goroutine — a connect may take a
// round trip, a name a lookup — and sends the request once it is up.
// The connection is counted against upstream.max_conns_per_replica, with
// the goroutine path's (conncap.go).
func (l *requestLoop) dial(c *loopConn) {
	r := c.r
	r.phase = phaseConnecting
	up, gen := r.f.up, r.gen
	if !up.cap.take() {
		l.upstreamFailed(c, nil, errNoFreeConns)
		return
	}
	addr, timeout := r.f.rep.Addr(), l.s.to.connect
	connect := up.connect
	go func() {
		start := time.Now()
		nc, err := (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).Dial("tcp", addr)
		fd := -1
		if err == nil {
			connect.Observe(time.Since(start).Seconds())
			var ok bool
			if fd, ok = netloop.Dup(nc); !ok {
				err = &net.OpError{Op: "dial", Net: "tcp", Err: errNoLoopConn}
			}
			nc.Close() //nolint:errcheck // the duplicate keeps the socket
		}
		if fd < 0 {
			up.cap.give()
		}
		var u *loopConn
		if err == nil {
			u = &loopConn{fd: fd, up: up, addrs: loopAddrs{nc.LocalAddr(), nc.RemoteAddr()}}
			u.end.MaxHead = l.s.cfg.MaxUpstreamHeader
		}
		posted := l.post(func() { l.dialed(c, r, gen, u, err) })
		if !posted && u != nil {
			unix.Close(fd)
			up.cap.give()
		}
	}()
}

// dialed takes a dial's result: the connection joins the loop, carrying
// the request it was dialed for unless that request has ended.
func (l *requestLoop) dialed(c *loopConn, r *loopReq, gen uint64, u *loopConn, err error) {
	live := c.r == r && r.gen == gen && r.phase == phaseConnecting
	if u != nil {
		if uerr := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, u.fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(u.fd)}); uerr != nil {
			unix.Close(u.fd)
			u.up.cap.give()
			u, err = nil, &net.OpError{Op: "dial", Net: "tcp", Err: uerr}
		} else {
			l.conns.Set(u.fd, u)
		}
	}
	switch {
	case !live && u != nil:
		l.putIdle(u)
	case !live:
	case err != nil:
		l.upstreamFailed(c, nil, err)
	default:
		c.r.phase = phaseAwaiting
		l.sendOn(c, u)
	}
}

// readUpstream reads an engine's answer; once whole, it is judged and
// relayed (answer).
func (l *requestLoop) readUpstream(u *loopConn) {
	if b := u.stream; b != nil {
		l.host.pull(b, l.now) // a stream's event (reqloop_stream_linux.go)
		return
	}
	n, err := netloop.Read(u.fd, l.buf)
	l.upstreamRead(u, l.buf, n, err)
}

// upstreamRead takes what a read of u's socket gave — n bytes at the
// start of buf (the loop's read buffer, or the batch's slot for u), or
// err — into the response in progress.
func (l *requestLoop) upstreamRead(u *loopConn, buf []byte, n int, err error) {
	if err == unix.EAGAIN || err == unix.EINTR {
		return
	}
	c := u.peer
	if c == nil || c.r == nil {
		// An idle connection the engine closed (or one answering nothing
		// asked): of no further use.
		l.closeUpstream(u)
		return
	}
	if n <= 0 {
		if err == nil && u.toClose && u.in != nil {
			l.whole(c, u) // the response ran to the close: whole now
			return
		}
		if err == nil {
			err = io.EOF
		}
		l.upstreamFailed(c, u, err)
		return
	}
	if u.in == nil {
		u.in = bytebufferpool.Get()
	}
	u.in.Write(buf[:n]) //nolint:errcheck
	u.last = l.now
	used, done, ferr := 0, false, error(nil)
	if !u.toClose {
		used, done, ferr = u.end.Feed(buf[:n])
	}
	switch {
	case errors.Is(ferr, h1.ErrToClose):
		// A response framed otherwise than a keep-alive connection can
		// carry — HTTP/1.0, a body to the close — is read to the close,
		// as fasthttp's client reads it, and its parse judges it (whole).
		u.toClose = true
	case ferr != nil:
		l.upstreamFailed(c, u, ferr)
		return
	}
	if !u.head {
		if at, end := finalHead(u.in.B); end >= 0 {
			u.head, u.headAt, u.headLen = true, at, end
			if (c.r.f.x.req.Stream || bytes.Contains(u.in.B[at:end], []byte("event-stream"))) && l.streamHead(c, u) {
				return // the stream's now (reqloop_stream_linux.go)
			}
			if u.toClose {
				u.toLen = l.headLength(u.in.B[at:end])
			}
		}
	}
	if u.toClose && u.head && u.toLen >= 0 {
		// An HTTP/1.0 answer that gives its length ends there, as
		// fasthttp's client reads it, though the engine keeps the
		// connection open (the loop does not keep it: extra).
		done = u.in.Len() >= u.headLen+u.toLen
	}
	u.extra = u.toClose || done && used < n
	switch {
	case u.head && u.in.Len()-u.headLen > l.s.cfg.MaxResponseBytes:
		l.tooLarge(c, u)
	case done:
		l.whole(c, u)
	}
}

// finalHead finds the response's own head in b, past any interim (1xx)
// ones: where it starts and ends; end is -1 while it is not all in.
func finalHead(b []byte) (at, end int) {
	for {
		i := bytes.Index(b[at:], []byte("\r\n\r\n"))
		if i < 0 {
			return at, -1
		}
		end = at + i + 4
		if h := b[at:end]; len(h) < 12 || h[9] != '1' || h[10] == '0' && h[11] == '1' { // 101 ends the exchange's HTTP
			return at, end
		}
		at = end
	}
}

// headLength is the Content-Length of a response head, -1 when it has
// none, headUnread when fasthttp can't read it.
func (l *requestLoop) headLength(head []byte) int {
	var h fasthttp.ResponseHeader
	l.rd.Reset(head)
	l.br.Reset(&l.rd)
	if h.Read(l.br) != nil {
		return headUnread
	}
	return max(h.ContentLength(), -1)
}

// headUnread is headLength's word for a head fasthttp's parse refuses.
const headUnread = -2

// tooLarge ends c's request whose answer on u runs past
// limits.max_response_bytes, as respondWhole does.
func (l *requestLoop) tooLarge(c *loopConn, u *loopConn) {
	r := c.r
	u.peer = nil
	l.closeUpstream(u)
	r.u = nil
	l.act(c, r.f.bodyFailed(r.f.tooLarge()))
}

// whole relays u's complete response from its bytes where it can
// (rawAnswer), else parses it with fasthttp's parser, frees or closes u,
// and relays the response.
func (l *requestLoop) whole(c *loopConn, u *loopConn) {
	if l.rawAnswer(c, u) {
		return
	}
	resp := fasthttp.AcquireResponse()
	l.rd.Reset(u.in.B)
	l.br.Reset(&l.rd)
	err := resp.ReadLimitBody(l.br, l.s.cfg.MaxResponseBytes)
	// A head fasthttp's parse refuses fails the attempt before any answer
	// came, as fasthttp's client fails it on the goroutine path; a body it
	// refuses fails the answer.
	headless := err != nil && l.headLength(u.in.B[u.headAt:u.headLen]) == headUnread
	extra := u.extra
	bytebufferpool.Put(u.in)
	u.in = nil
	c.r.u = nil
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		u.peer = nil
		l.closeUpstream(u)
		if headless {
			l.act(c, c.r.f.failed(err))
			return
		}
		l.attemptError(c, u, err)
		return
	}
	if resp.ConnectionClose() || extra {
		u.peer = nil
		l.closeUpstream(u)
	} else {
		l.putIdle(u)
	}
	// The flow judges it (a refusal or a 502 tries another replica), and
	// it is the client's answer, as respondWhole writes it.
	f := &c.r.f
	if a := f.answered(resp); a != actStream && a != actWhole {
		fasthttp.ReleaseResponse(resp)
		l.act(c, a)
		return
	}
	buf := bytebufferpool.Get()
	buf.Set(resp.Body())
	l.s.m.parsedAnswers.Inc()
	l.act(c, f.whole(resp, buf))
}

// upstreamGone is an engine connection that failed on a write.
func (l *requestLoop) upstreamGone(u *loopConn) {
	if c := u.peer; c != nil && c.r != nil {
		l.upstreamFailed(c, u, io.ErrUnexpectedEOF)
		return
	}
	l.closeUpstream(u)
}

// upstreamFailed ends c's attempt on u (nil: not yet connected) with
// err. A reused connection the engine had closed before any response
// byte is no failure (staleRetry's rule): the request goes again on a new
// one.
func (l *requestLoop) upstreamFailed(c *loopConn, u *loopConn, err error) {
	r := c.r
	stale := false
	if u != nil {
		stale = u.reused && !u.head && (u.in == nil || u.in.Len() == 0) && peerClosedErr(err)
		if u.in != nil {
			bytebufferpool.Put(u.in)
			u.in = nil
		}
		u.peer = nil
		l.closeUpstream(u)
		r.u = nil
	}
	if stale {
		l.s.m.stale.WithLabelValues(r.f.rep.Name()).Inc()
		l.dial(c)
		return
	}
	l.attemptError(c, u, err)
}

// attemptError is an attempt that failed with err: before the answer's
// head, the flow may try another replica; after, the request ends.
func (l *requestLoop) attemptError(c *loopConn, u *loopConn, err error) {
	if u != nil && u.head {
		l.act(c, c.r.f.bodyFailed(err))
		return
	}
	l.act(c, c.r.f.failed(err))
}

// closeUpstream closes an engine connection and forgets it.
func (l *requestLoop) closeUpstream(u *loopConn) {
	if u.fd < 0 {
		return
	}
	if idle := l.idle[u.up]; len(idle) > 0 {
		for i, v := range idle {
			if v == u {
				l.idle[u.up] = append(idle[:i], idle[i+1:]...)
				break
			}
		}
	}
	l.forget(u)
	u.up.cap.give()
}

// scanUpstream closes an idle connection past upstream.max_idle_conn_time,
// as fasthttp's client does; kept: it stays, for now.
func (l *requestLoop) scanUpstream(u *loopConn) (kept bool) {
	if l.now.Sub(u.since) > l.s.to.engineKeepAlive {
		l.closeUpstream(u)
		return false
	}
	return true
}
