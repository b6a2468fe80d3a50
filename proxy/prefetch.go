package proxy

import (
	"errors"
	"github.com/gpurouter/gpurouter/internal/netloop"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// prefetchListener hands fasthttp connections whose small reads read
// ahead. With ReduceMemoryUsage (server.go) fasthttp waits for a keep-alive
// connection's next request with a one-byte read, so that an idle
// connection or a stream holds no read buffer, and then reads the rest:
// two read(2) calls per request where one would do. A prefetchConn answers
// that one-byte read with one read(2) of up to prefetchSize into a pooled
// buffer — a request usually arrives whole — and serves the rest from it,
// returning the buffer as soon as it is drained, so nothing is held while
// the connection waits.
//
// It also holds the client connections to max (0: no limit), counting each
// from Accept to its Close: fasthttp's own limit (Server.Concurrency) stops
// counting a connection once a stream hijacks it (hijack.go). A connection
// over the limit is answered 503 and closed, as fasthttp answers one over
// its own.
type prefetchListener struct {
	net.Listener
	max  int
	open *atomic.Int64 // connections accepted and not yet closed; nil: none counted
	// take gives a connection to a request loop (reqloop_linux.go): false
	// leaves it to fasthttp. nil: every connection is fasthttp's.
	take func(net.Conn) bool
	// door frames the reads of the connections fasthttp gets
	// (frontdoor.go); nil passes their bytes on as they come.
	door *frontDoor
}

func (l prefetchListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open == nil {
			return newPrefetchConn(c, nil, l.door), nil
		}
		if n := l.open.Add(1); l.max > 0 && n > int64(l.max) {
			l.open.Add(-1)
			refuseConn(c)
			continue
		}
		if l.take != nil && l.take(c) {
			continue
		}
		return newPrefetchConn(c, l.open, l.door), nil
	}
}

// refuseConn answers a connection over the limit with fasthttp's words and
// closes it, without waiting on a client that does not read.
func refuseConn(c net.Conn) {
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond)) //nolint:errcheck
	io.WriteString(c, refusedResponse)                         //nolint:errcheck
	c.Close()                                                  //nolint:errcheck
}

const refusedBody = "The connection cannot be served because Server.Concurrency limit exceeded"

var refusedResponse = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
	strconv.Itoa(len(refusedBody)) + "\r\nConnection: close\r\n\r\n" + refusedBody

// prefetchSize is how much a small read reads ahead: a chat request with
// its headers is typically under 2 KiB; a larger one is read on from the
// socket by fasthttp's own buffer.
const prefetchSize = 2 << 10

var prefetchBufs = sync.Pool{New: func() any { b := make([]byte, prefetchSize); return &b }}

// prefetchConn is a net.Conn whose reads may be served from bytes read
// ahead, and, with a front door, framed by it: fasthttp reads a request
// only once its head has been checked (frontdoor.go). Only the goroutine
// serving the connection reads from it.
type prefetchConn struct {
	net.Conn
	buf    *[]byte       // read ahead and not yet consumed; nil when none (the usual state)
	r, w   int           // the unread bytes are (*buf)[r:w]
	state  keptState     // once handed back after a stream (hijack.go)
	open   *atomic.Int64 // the listener's count, left at the first Close; nil: not counted
	closed atomic.Bool
	// lingers: Close drains the client's unread bytes first (linger.go),
	// set where a request is refused before it was read whole.
	lingers atomic.Bool
	sock    netloop.RawSock // Linux: the socket's raw reads and writes (rawsock_linux.go)
	// door frames its reads (frontdoor.go); nil: none, its bytes pass on
	// as they come.
	door *frontDoor
	frameState
}

func newPrefetchConn(c net.Conn, open *atomic.Int64, door *frontDoor) *prefetchConn {
	pc := &prefetchConn{Conn: c, open: open, door: door}
	pc.sock.Set(c)
	return pc
}

// Close closes the connection and, the first time, leaves the listener's
// count. A connection marked by lingerOnClose lingers first.
func (c *prefetchConn) Close() error {
	if c.lingers.Swap(false) {
		linger(c.Conn, c.readConn)
	}
	if c.open != nil && c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

// lingerOnClose has Close drain what the client still sends before it
// closes (linger.go): for a connection whose request is answered before it
// was read whole.
func (c *prefetchConn) lingerOnClose() { c.lingers.Store(true) }

func (c *prefetchConn) Read(p []byte) (int, error) {
	if c.door != nil {
		return c.readFramed(p)
	}
	return c.readAhead(p)
}

// readAhead reads p from the bytes read ahead, else from the socket,
// reading ahead when p is small.
func (c *prefetchConn) readAhead(p []byte) (int, error) {
	if c.buf != nil {
		n := copy(p, (*c.buf)[c.r:c.w])
		c.r += n
		c.releaseDrained()
		return n, nil
	}
	if len(p) >= prefetchSize/2 {
		return c.readConn(p) // a buffer of its own: read straight into it
	}
	b := prefetchBufs.Get().(*[]byte)
	n, err := c.readConn(*b)
	k := copy(p, (*b)[:n])
	if k == n {
		prefetchBufs.Put(b)
		return k, err
	}
	// The rest is served by the next reads; an error that came with the
	// bytes comes back when they are used up and the socket is read again.
	c.buf, c.r, c.w = b, k, n
	return k, nil
}

func (c *prefetchConn) readConn(p []byte) (int, error) {
	if c.sock.OK() {
		return c.sock.Read(p)
	}
	return c.Conn.Read(p)
}

func (c *prefetchConn) Write(p []byte) (int, error) {
	if c.sock.OK() {
		return c.sock.Write(p)
	}
	return c.Conn.Write(p)
}

// SyscallConn exposes the socket for the client watch's peeks (watch.go).
func (c *prefetchConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errNotSocket
	}
	return sc.SyscallConn()
}

var errNotSocket = errors.New("proxy: connection is not a socket")
