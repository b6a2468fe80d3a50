//go:build !unix

package netloop

import "syscall"

// PeerClosed cannot peek portably here; disconnects are then found by the
// next failed write.
func PeerClosed(syscall.RawConn) bool { return false }
