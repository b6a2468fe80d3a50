//go:build linux

// Package looptest has the loopback sockets the tests of the loops'
// I/O use (netloop's, proxy's), as httptest has servers.
package looptest

import (
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TCPPair is a loopback connection: the side under test (wrapped by wrap;
// nil: as it is) and its peer, both closed when the test ends.
func TCPPair(t testing.TB, wrap func(testing.TB, net.Conn) net.Conn) (net.Conn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); p.Close() })
	if wrap == nil {
		return c, p.(*net.TCPConn)
	}
	return wrap(t, c), p.(*net.TCPConn)
}

// RawPair is a loopback connection's raw socket, as a loop holds a
// client's or an engine's, the connection, and its peer.
func RawPair(t testing.TB) (syscall.RawConn, net.Conn, *net.TCPConn) {
	t.Helper()
	c, p := TCPPair(t, nil)
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return rc, c, p
}

// SocketPair is a connected loopback pair's descriptors, duplicated out of
// Go's netpoller (non-blocking, as a loop holds them), closed when the
// test ends.
func SocketPair(t testing.TB) (a, b int) {
	t.Helper()
	c, p := TCPPair(t, nil)
	a, b = dup(t, c), dup(t, p)
	t.Cleanup(func() { unix.Close(a); unix.Close(b) })
	return a, b
}

func dup(t testing.TB, c net.Conn) int {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	var dupErr error
	if err := rc.Control(func(s uintptr) { fd, dupErr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || dupErr != nil {
		t.Fatal(err, dupErr)
	}
	return fd
}
