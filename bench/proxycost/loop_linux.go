//go:build linux

package proxycost

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpurouter/gpurouter/internal/h1"
)

// ServeLoop runs the floor of a data plane that does its own I/O instead
// of Go's netpoller: one goroutine on its own thread, one level-triggered
// epoll set, non-blocking sockets read once per readiness and written at
// once — how HAProxy and nginx run — relaying HTTP/1.1 between clients and
// keep-alive upstream connections byte for byte (a response's end found
// from its Content-Length or chunked framing, nothing parsed beyond
// that). It is the "epoll-bare" column: what Go costs per request and per
// event when no goroutine parks and no socket is read until EAGAIN, the
// floor under which no Go router built that way could go. It listens on
// addr (IPv4 host:port) until ctx ends. Requests must carry their body by
// Content-Length (what every OpenAI client sends). It is a measuring
// instrument, not a server to run: bytes a socket does not take wait in
// memory without bound (the harness's clients read at once), the upstream
// connect blocks, and there are no timeouts.
func ServeLoop(ctx context.Context, addr, upstream string) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l, err := newLoop(addr, upstream)
	if err != nil {
		return err
	}
	defer l.close()
	return l.run(ctx)
}

// loopConn is one socket of the loop: a client's or an upstream's.
type loopConn struct {
	fd       int
	upstream bool
	peer     *loopConn      // the other side of the exchange in progress, nil between exchanges
	in       []byte         // a client's request bytes not yet complete
	out      []byte         // bytes accepted for this socket that it could not take yet
	resp     h1.ResponseEnd // an upstream's progress through its response
}

// loop is ServeLoop's state, touched only by its goroutine.
type loop struct {
	ep, ln int
	up     unix.Sockaddr
	conns  map[int]*loopConn
	idle   []*loopConn // keep-alive upstream connections free for the next request
	buf    []byte      // the one read buffer: every read is handed on before the next
	events []unix.EpollEvent
}

func newLoop(addr, upstream string) (*loop, error) {
	la, err := sockaddr(addr)
	if err != nil {
		return nil, err
	}
	ua, err := sockaddr(upstream)
	if err != nil {
		return nil, err
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	l := &loop{ep: ep, ln: -1, up: ua, conns: map[int]*loopConn{}, buf: make([]byte, 64<<10), events: make([]unix.EpollEvent, 256)}
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		l.close()
		return nil, err
	}
	l.ln = ln
	if err := unix.SetsockoptInt(ln, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		l.close()
		return nil, err
	}
	if err := unix.Bind(ln, la); err != nil {
		l.close()
		return nil, fmt.Errorf("epoll-bare: bind %s: %w", addr, err)
	}
	if err := unix.Listen(ln, 4096); err != nil {
		l.close()
		return nil, err
	}
	if err := l.watch(ln, unix.EPOLLIN); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

func sockaddr(hostport string) (unix.Sockaddr, error) {
	a, err := net.ResolveTCPAddr("tcp4", hostport)
	if err != nil {
		return nil, err
	}
	sa := &unix.SockaddrInet4{Port: a.Port}
	copy(sa.Addr[:], a.IP.To4())
	return sa, nil
}

func (l *loop) watch(fd int, ev uint32) error {
	return unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: ev, Fd: int32(fd)})
}

func (l *loop) rewatch(fd int, ev uint32) {
	_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_MOD, fd, &unix.EpollEvent{Events: ev, Fd: int32(fd)})
}

func (l *loop) close() {
	for fd := range l.conns {
		unix.Close(fd)
	}
	if l.ln >= 0 {
		unix.Close(l.ln)
	}
	unix.Close(l.ep)
}

// run waits at most 100 ms at a time, so that it sees ctx end without a
// second descriptor to wake it: ten wake-ups a second, nothing per request.
func (l *loop) run(ctx context.Context) error {
	for ctx.Err() == nil {
		n, err := l.wait(100)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		for _, ev := range l.events[:n] {
			fd := int(ev.Fd)
			if fd == l.ln {
				l.accept()
				continue
			}
			c := l.conns[fd]
			if c == nil {
				continue
			}
			if ev.Events&unix.EPOLLOUT != 0 && !l.flush(c) {
				continue
			}
			if ev.Events&(unix.EPOLLIN|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
				l.read(c)
			}
		}
	}
	return nil
}

// wait is epoll_wait as a raw system call (epoll_pwait without a signal
// mask: arm64 has no epoll_wait). The runtime is not told that the thread
// blocks, so it does not hand the goroutine's P to another thread after
// 20 µs and take it back when the call returns — a round of wake-ups per
// event that a loop waiting between events would pay every time. The
// goroutine holds its P while it waits; a stop-the-world preempts it with
// a signal, which ends the wait (EINTR: epoll_pwait is never restarted
// after a signal handler).
func (l *loop) wait(msec int) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), uintptr(msec), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func (l *loop) accept() {
	for i := 0; i < 64; i++ {
		fd, _, err := unix.Accept4(l.ln, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		if l.watch(fd, unix.EPOLLIN|unix.EPOLLRDHUP) != nil {
			unix.Close(fd)
			continue
		}
		l.conns[fd] = &loopConn{fd: fd}
	}
}

// read takes what one read(2) returns and hands it on.
func (l *loop) read(c *loopConn) {
	n, err := unix.Read(c.fd, l.buf)
	if err == unix.EAGAIN {
		return
	}
	if n <= 0 {
		l.drop(c)
		return
	}
	b := l.buf[:n]
	if c.upstream {
		l.fromUpstream(c, b)
	} else {
		l.fromClient(c, b)
	}
}

func (l *loop) fromClient(c *loopConn, b []byte) {
	if c.peer != nil { // pipelined before the response ended: keep it
		c.in = append(c.in, b...)
		return
	}
	if len(c.in) > 0 {
		c.in = append(c.in, b...)
		b = c.in
	}
	n := h1.RequestLen(b, h1.DefaultMaxHead)
	switch {
	case n < 0:
		l.drop(c)
		return
	case n == 0 || n > len(b): // incomplete
		if len(c.in) == 0 {
			c.in = append(c.in, b...)
		}
		return
	}
	u := l.upstreamConn()
	if u == nil {
		l.drop(c)
		return
	}
	c.peer, u.peer = u, c
	u.resp.Reset()
	l.send(u, b[:n])
	if rest := b[n:]; len(rest) > 0 {
		c.in = append(c.in[:0], rest...)
	} else {
		c.in = c.in[:0]
	}
}

func (l *loop) fromUpstream(u *loopConn, b []byte) {
	c := u.peer
	if c == nil { // an idle connection closing, or answering nothing asked
		l.drop(u)
		return
	}
	n, done, err := u.resp.Feed(b)
	if err != nil {
		l.drop(u)
		return
	}
	l.send(c, b[:n])
	if l.conns[u.fd] != u { // the client was dropped, and u with it
		return
	}
	if done {
		u.peer, c.peer = nil, nil
		if n < len(b) { // bytes past the response: out of step with its requests
			l.drop(u)
		} else {
			l.idle = append(l.idle, u)
		}
		if len(c.in) > 0 { // the next request came while this one streamed
			in := c.in
			c.in = nil
			l.fromClient(c, in)
		}
	}
}

// send writes b to c now, keeping what the socket does not take for
// EPOLLOUT.
func (l *loop) send(c *loopConn, b []byte) {
	if len(c.out) == 0 {
		n, err := unix.Write(c.fd, b)
		if err != nil && err != unix.EAGAIN {
			l.drop(c)
			return
		}
		if n == len(b) {
			return
		}
		b = b[max(n, 0):]
		l.rewatch(c.fd, unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLOUT)
	}
	c.out = append(c.out, b...)
}

// flush writes c's pending bytes; false when c was dropped.
func (l *loop) flush(c *loopConn) bool {
	n, err := unix.Write(c.fd, c.out)
	if err != nil && err != unix.EAGAIN {
		l.drop(c)
		return false
	}
	c.out = c.out[max(n, 0):]
	if len(c.out) == 0 {
		c.out = nil
		l.rewatch(c.fd, unix.EPOLLIN|unix.EPOLLRDHUP)
	}
	return true
}

// upstreamConn is an idle keep-alive connection, else a new one (a
// blocking connect: loopback answers at once, and this is a floor).
func (l *loop) upstreamConn() *loopConn {
	if n := len(l.idle); n > 0 {
		u := l.idle[n-1]
		l.idle = l.idle[:n-1]
		return u
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	if err := unix.Connect(fd, l.up); err != nil {
		unix.Close(fd)
		return nil
	}
	_ = unix.SetNonblock(fd, true)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	if l.watch(fd, unix.EPOLLIN|unix.EPOLLRDHUP) != nil {
		unix.Close(fd)
		return nil
	}
	u := &loopConn{fd: fd, upstream: true}
	l.conns[fd] = u
	return u
}

// drop closes c and the exchange it is in: a client gone mid-stream
// closes its upstream connection too (which tells the engine to stop).
func (l *loop) drop(c *loopConn) {
	if _, ok := l.conns[c.fd]; !ok {
		return
	}
	delete(l.conns, c.fd)
	unix.Close(c.fd)
	if c.upstream {
		for i, u := range l.idle {
			if u == c {
				l.idle = append(l.idle[:i], l.idle[i+1:]...)
				break
			}
		}
	}
	if p := c.peer; p != nil {
		p.peer, c.peer = nil, nil
		l.drop(p)
	}
}
