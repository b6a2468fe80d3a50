//go:build linux

package netloop

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// FileConn is an upstream socket the stream loop gives back to Go's
// netpoller (detachedBody): the socket as an *os.File, which registers
// the descriptor with the netpoller in two system calls (fcntl, epoll_ctl)
// and keeps it. net.FileConn takes eleven: a dup and a close, three calls
// to learn the socket's type and addresses, and five setsockopt for the
// no-delay and keep-alive settings the socket already has — about 6 µs of
// every stream, BenchmarkGiveBackUpstream. Reads and writes go through
// RawSock (deadlineConn.withSock) as a *net.TCPConn's do; its own Read
// and Write (the race detector's build) report errors as net.Conn's.
// Its zero value is not usable: NewFileConn.
type FileConn struct {
	f            *os.File
	laddr, raddr net.Addr
	closed       atomic.Bool
}

// NewFileConn takes ownership of fd, a connected non-blocking TCP socket
// (a non-blocking descriptor is what makes os.NewFile register it with
// the netpoller, and deadlines work); laddr and raddr are its addresses.
func NewFileConn(fd int, laddr, raddr net.Addr) *FileConn {
	return &FileConn{f: os.NewFile(uintptr(fd), "upstream"), laddr: laddr, raddr: raddr}
}

func (c *FileConn) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	return n, c.netError("read", err)
}

func (c *FileConn) Write(p []byte) (int, error) {
	n, err := c.f.Write(p)
	return n, c.netError("write", err)
}

func (c *FileConn) Close() error {
	c.closed.Store(true)
	return c.netError("close", c.f.Close())
}

// CloseWrite shuts down the socket's write side (closeWriter), as a
// *net.TCPConn's does.
func (c *FileConn) CloseWrite() error {
	rc, err := c.f.SyscallConn()
	if err != nil {
		return c.netError("close", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = syscall.Shutdown(int(fd), syscall.SHUT_WR) }); err != nil {
		return c.netError("close", err)
	}
	return c.netError("close", serr)
}

func (c *FileConn) LocalAddr() net.Addr                { return c.laddr }
func (c *FileConn) RemoteAddr() net.Addr               { return c.raddr }
func (c *FileConn) SetDeadline(t time.Time) error      { return c.f.SetDeadline(t) }
func (c *FileConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c *FileConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }

// SyscallConn is the socket's, waiting in the netpoller (syscall.Conn).
// A wait that a Close ends fails with net.ErrClosed, as a *net.TCPConn's
// does (an *os.File's says "use of closed file", which peerClosedErr would
// not know).
func (c *FileConn) SyscallConn() (syscall.RawConn, error) {
	rc, err := c.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	return fileRawConn{rc, c}, nil
}

// fileRawConn is a FileConn's syscall.RawConn: the *os.File's, its errors
// after Close worded as net.ErrClosed (rawError).
type fileRawConn struct {
	syscall.RawConn
	c *FileConn
}

func (r fileRawConn) Control(f func(uintptr)) error    { return r.c.rawError(r.RawConn.Control(f)) }
func (r fileRawConn) Read(f func(uintptr) bool) error  { return r.c.rawError(r.RawConn.Read(f)) }
func (r fileRawConn) Write(f func(uintptr) bool) error { return r.c.rawError(r.RawConn.Write(f)) }

func (c *FileConn) rawError(err error) error {
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && c.closed.Load() {
		return net.ErrClosed
	}
	return err
}

// netError words an *os.File's error as a net.Conn's: a *net.OpError
// around the system call's error, net.ErrClosed for a closed connection,
// io.EOF as it is.
func (c *FileConn) netError(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	if errors.Is(err, os.ErrClosed) {
		err = net.ErrClosed
	} else if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
		if errno, ok := err.(syscall.Errno); ok && op != "close" {
			err = os.NewSyscallError(op, errno) // as net.Conn words a failed read(2) or write(2)
		}
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.laddr, Addr: c.raddr, Err: err}
}
