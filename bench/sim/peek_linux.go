//go:build linux

package sim

import (
	"net"
	"syscall"
)

// peerClosed reports whether the client closed its side of c, without
// consuming anything and without blocking: a non-blocking MSG_PEEK read
// returns 0 bytes only at end of stream (or fails with ECONNRESET).
func peerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == nil:
			closed = n == 0
		case err == syscall.EAGAIN || err == syscall.EINTR:
		default:
			closed = true
		}
		return true
	})
	return closed || err != nil
}
