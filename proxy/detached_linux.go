//go:build linux

package proxy

import (
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/gpurouter/gpurouter/internal/h1"
	"github.com/gpurouter/gpurouter/internal/netloop"
	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// errChunked is an upstream body whose chunked framing is broken.
var errChunked = fmt.Errorf("%w: malformed chunked framing", ErrUpstream)

// decode takes the chunked framing off src into dst (h1.Chunked.Decode),
// a refusal being the engine's failure.
func (b *detachedBody) decode(dst, src []byte) (n, used int, err error) {
	n, used, err = b.dec.Decode(dst, src)
	if err != nil {
		err = fmt.Errorf("%w: %w", errChunked, err)
	}
	return n, used, err
}

// detachedBody is a stream's upstream after its head, taken from fasthttp
// (detach): its own socket, read by the loop, or — once handed back — by
// the goroutine relay through Read, as fasthttp's body stream would be.
type detachedBody struct {
	pump   *streamPump
	r      *relay
	dec    h1.Chunked      // the body's chunked framing, taken off as it is read
	stash  []byte          // body bytes read with the head, not yet decoded
	client syscall.RawConn // the client's socket, written by the loop; nil for a request loop's stream (clientFD)
	// clientFD is a request loop's stream's client socket, out of Go's
	// netpoller, in the request loop's set (client nil; host); -1 otherwise.
	clientFD int
	// onBack takes the stream back from a hosted loop, on its goroutine,
	// in place of back's receiver (host); nil: take's caller waits on back.
	onBack func(pumpResult)
	write  func(uintptr) bool // writeFrame, for client.Write
	frame  []byte             // what write writes (send's chunk), while it does
	wn     int                // and how it went
	werr   error
	back   chan pumpResult
	// reuse takes the connection back once the response has ended cleanly
	// (CloseWithError); nil when the engine said it closes it. extra: bytes
	// came after the response's end, so the connection is not reused.
	reuse *idleConns
	extra bool
	// cap is the replica's connection count, which the socket leaves when
	// it closes (conncap.go); nil: not counted.
	cap *connCap
	// The socket's addresses, for the connection it becomes again.
	laddr, raddr net.Addr

	// The loop's, while the stream is in it.
	in       bool      // in the epoll set
	pfd      int       // fd as the set knows it
	cfd      int       // the client's socket, in the set for hang-ups; -1 if not
	deadline time.Time // first byte or idle: the read must come by then
	to       *timeouts // limit's

	mu     sync.Mutex
	fd     int      // the socket, until conn wraps it (-1 then, or once closed)
	conn   net.Conn // the socket wrapped for the goroutine relay's reads; nil until needed
	raw    []byte   // the goroutine relay's read buffer
	inPump bool
	closed bool
}

// limit is the read deadline's distance: first byte, then idle.
func (b *detachedBody) limit() time.Duration {
	return b.to.readLimit(b.r.gotBody)
}

// detach takes a stream's upstream from fasthttp when the loop can relay
// it: a chunked response whose head came alone on a plain socket
// (deadlineConn.limitHead), to a client on the router's own listener. It
// closes fasthttp's body stream, which closes fasthttp's connection (and
// so takes the socket out of Go's netpoller) while a duplicate descriptor
// keeps the socket open. nil when the stream stays fasthttp's.
func (p *streamPump) detach(x *exchange, resp *fasthttp.Response, client net.Conn) *detachedBody {
	c := x.upc
	x.upc = nil
	if c == nil || !c.headCut || resp.Header.ContentLength() != -1 {
		return nil
	}
	p.mu.Lock()
	running := p.running
	p.mu.Unlock()
	if !running {
		return nil
	}
	pc, ok := client.(*prefetchConn)
	if !ok {
		return nil
	}
	cs, ok := pc.Conn.(syscall.Conn)
	if !ok {
		return nil
	}
	craw, err := cs.SyscallConn()
	if err != nil {
		return nil
	}
	us, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil // TLS
	}
	uraw, err := us.SyscallConn()
	if err != nil {
		return nil
	}
	fd := -1
	var dupErr error
	if err := uraw.Control(func(s uintptr) { fd, dupErr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || dupErr != nil || fd < 0 {
		return nil
	}
	// The duplicate counts as a connection of its own until it closes, as
	// fasthttp's, which CloseBodyStream closes below, did until then.
	c.cap.add()
	b := &detachedBody{
		pump: p, stash: c.stash, client: craw, clientFD: -1, back: make(chan pumpResult, 1),
		to: c.to, fd: fd, cfd: -1, cap: c.cap,
		laddr: c.Conn.LocalAddr(), raddr: c.Conn.RemoteAddr(),
	}
	b.write = b.writeFrame
	if !resp.ConnectionClose() && x.up != nil {
		b.reuse = &x.up.idle
	}
	if c.awaiting && !c.armed.IsZero() {
		b.deadline = c.armed // the first-byte deadline already running
	}
	c.stash = nil
	resp.CloseBodyStream() //nolint:errcheck // closes fasthttp's descriptor; b keeps the socket
	return b
}

// Read is the goroutine relay's read of the stream: the chunked body's
// data, as fasthttp's body stream gives it.
func (b *detachedBody) Read(p []byte) (int, error) {
	for {
		if len(b.stash) > 0 {
			n, used, err := b.decode(p, b.stash)
			b.stash = b.stash[used:]
			switch {
			case err != nil:
				return n, err
			case b.dec.Done():
				return n, io.EOF
			case n > 0:
				return n, nil
			}
			continue // framing only
		}
		if b.dec.Done() {
			return 0, io.EOF
		}
		c, err := b.netConn()
		if err != nil {
			return 0, err
		}
		n, err := c.Read(b.raw)
		b.stash = b.raw[:n]
		if n == 0 && err != nil {
			return 0, err
		}
	}
}

// netConn wraps the socket for Go's netpoller, once, with the same first-
// byte and idle deadlines fasthttp's reads had (deadlineConn).
func (b *detachedBody) netConn() (net.Conn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, net.ErrClosed
	}
	if b.conn == nil {
		b.conn = upstreamConn(b.fd, b.laddr, b.raddr, b.to, b.cap, b.r != nil && b.r.gotBody)
		b.fd = -1
		b.raw = make([]byte, relayBufSize)
	}
	return b.conn, nil
}

// owns reports whether b's socket is still open as descriptor fd: not
// closed by the loop (handBack), nor wrapped for the netpoller.
func (b *detachedBody) owns(fd int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return fd >= 0 && b.fd == fd
}

// upstreamConn is a stream's engine socket fd back in Go's netpoller
// (netloop.FileConn), with the first-byte and idle deadlines fasthttp's reads
// have (deadlineConn); gotBody: a byte of the body has come (idle's). Its
// close takes it off cap.
func upstreamConn(fd int, laddr, raddr net.Addr, to *timeouts, cap *connCap, gotBody bool) *deadlineConn {
	return (&deadlineConn{Conn: netloop.NewFileConn(fd, laddr, raddr), to: to, cap: cap, awaiting: !gotBody, headEnd: 4}).withSock()
}

// CloseWithError closes the stream's socket, which aborts the engine's
// sequence if it still runs; in the loop, the loop closes it. A response
// read to its end (err nil) leaves its connection to the replica's next
// request instead, as fasthttp would.
func (b *detachedBody) CloseWithError(err error) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	if b.inPump {
		b.mu.Unlock()
		b.pump.abort(b)
		return nil
	}
	if err == nil && b.reuse != nil && b.dec.Done() && len(b.stash) == 0 && !b.extra {
		// Still counted: the idle set's now.
		c := b.conn
		if dc, ok := c.(*deadlineConn); ok {
			c = dc.Conn
		} else if c == nil && b.fd >= 0 {
			c = netloop.NewFileConn(b.fd, b.laddr, b.raddr)
			b.fd = -1
		}
		b.mu.Unlock()
		if c != nil {
			b.reuse.put(c, time.Now())
		}
		return nil
	}
	if b.conn != nil {
		b.conn.Close() //nolint:errcheck // and off the count (upstreamConn)
	} else if b.fd >= 0 {
		unix.Close(b.fd)
		b.fd = -1
		b.cap.give()
	}
	b.mu.Unlock()
	return nil
}

// pumpStream relays r's stream in the loop while it can, when its upstream
// was detached; on return the goroutine relay goes on from where the loop
// stopped. An error means the client is gone.
func (r *relay) pumpStream(w io.Writer) error {
	b, ok := r.body.(*detachedBody)
	if !ok {
		return nil
	}
	b.r = r
	// The loop's writes never block; a write deadline left in force
	// would fail them once it passed. The goroutine arms its own again.
	r.disarmWrite()
	res, ok := b.pump.take(b)
	if !ok {
		return nil
	}
	if r.watch != nil {
		r.watch.resume() // the loop watched the client meanwhile
	}
	return r.afterPump(w, res)
}

// afterPump takes the stream on from where the loop handed it back (res),
// before the goroutine relay goes on. An error means the client is gone.
func (r *relay) afterPump(w io.Writer, res pumpResult) error {
	if len(res.unsent) > 0 {
		if err := r.armWrite(); err != nil {
			return err
		}
		if _, err := w.Write(res.unsent); err != nil {
			return err
		}
	}
	switch {
	case res.clientErr != nil:
		return res.clientErr
	case res.leaving:
		r.upstreamFailed(errLeaving)
	case res.readErr != nil:
		return r.afterRead(res.readErr)
	}
	return nil
}
