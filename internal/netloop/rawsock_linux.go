//go:build linux

package netloop

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// RawSock reads and writes a connection's non-blocking socket with raw
// read(2) and write(2), waiting in Go's netpoller only when the socket has
// nothing to read or no room (syscall.RawConn). net.Conn's own Read and
// Write tell the runtime they enter a system call; a loopback write runs
// the receiver's whole TCP path inside it, often long enough for the
// runtime's monitor to hand the goroutine's P to another thread, which it
// wakes for that, and to wake itself ever more often while that goes on.
// These calls never block, so the runtime need not know. Deadlines and
// Close behave as for net.Conn: the waits are the netpoller's.
//
// Reads are serialized among themselves and writes among themselves, as
// net.Conn's are. The zero value is unset: ok reports false and the owner
// uses its net.Conn.
type RawSock struct {
	rmu, wmu        sync.Mutex // a read's fields, a write's fields
	rc              syscall.RawConn
	laddr, raddr    net.Addr
	rp, wp          []byte // the read's buffer, the write's bytes left
	rn, wn          int
	rerr, werr      error
	readFn, writeFn func(uintptr) bool // method values, made once: no allocation per call
}

// Set takes c's socket when it is a TCP connection and the build is not
// the race detector's (race_on.go); false leaves the zero value.
func (s *RawSock) Set(c net.Conn) bool {
	if raceBuild {
		return false
	}
	return s.take(c)
}

// take takes c's socket when it is a TCP connection: Go's, or one the
// stream loop gave back (FileConn).
func (s *RawSock) take(c net.Conn) bool {
	var sc syscall.Conn
	switch tc := c.(type) {
	case *net.TCPConn:
		sc = tc
	case *FileConn:
		sc = tc
	default:
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	s.rc, s.laddr, s.raddr = rc, c.LocalAddr(), c.RemoteAddr()
	s.readFn, s.writeFn = s.doRead, s.doWrite
	return true
}

func (s *RawSock) OK() bool { return s.rc != nil }

func (s *RawSock) doRead(fd uintptr) bool {
	for {
		n, err := Read(int(fd), s.rp)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false // wait for bytes
		}
		s.rn, s.rerr = max(n, 0), err
		return true
	}
}

func (s *RawSock) doWrite(fd uintptr) bool {
	for len(s.wp) > 0 {
		n, err := Write(int(fd), s.wp)
		switch err {
		case nil:
			s.wn += n
			s.wp = s.wp[n:]
		case unix.EINTR:
		case unix.EAGAIN:
			return false // wait for room
		default:
			s.werr = err
			return true
		}
	}
	return true
}

// Read is net.Conn's Read: io.EOF at the peer's end, *net.OpError else.
func (s *RawSock) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.rmu.Lock()
	s.rp, s.rn, s.rerr = p, 0, nil
	err := s.rc.Read(s.readFn)
	n, rerr := s.rn, s.rerr
	s.rp = nil
	s.rmu.Unlock()
	switch {
	case err != nil:
		return 0, s.opError("read", err)
	case rerr != nil:
		return 0, s.opError("read", os.NewSyscallError("read", rerr))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write is net.Conn's Write: all of p, or an error with what was written.
func (s *RawSock) Write(p []byte) (int, error) {
	s.wmu.Lock()
	s.wp, s.wn, s.werr = p, 0, nil
	err := s.rc.Write(s.writeFn)
	n, werr := s.wn, s.werr
	s.wp = nil
	s.wmu.Unlock()
	switch {
	case err != nil:
		return n, s.opError("write", err)
	case werr != nil:
		return n, s.opError("write", os.NewSyscallError("write", werr))
	}
	return n, nil
}

// opError words err as net.Conn's would be: the raw calls' errors say
// "raw-read" and "raw-write".
func (s *RawSock) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: s.laddr, Addr: s.raddr, Err: err}
}
