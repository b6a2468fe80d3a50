//go:build unix

package netloop

import (
	"errors"
	"os"
	"syscall"
)

// PeerClosed reports whether the peer of a socket has closed it, without
// consuming data: a non-blocking MSG_PEEK read returns 0 bytes only at
// end of stream, and an error other than "would block" means the
// connection is dead (reset).
func PeerClosed(raw syscall.RawConn) bool {
	var closed bool
	var b [1]byte
	err := raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EAGAIN || err == syscall.EINTR:
		case err != nil:
			closed = true
		case n == 0:
			closed = true
		}
		return true
	})
	// An error from raw.Read itself (not from recvfrom) is about the fd:
	// closed means gone, a deadline means nothing about the peer.
	return closed || (err != nil && !errors.Is(err, os.ErrDeadlineExceeded))
}
