//go:build !unix

package proxy

import "syscall"

// peerClosed cannot peek portably here; disconnects are then found by the
// next failed write.
func peerClosed(syscall.RawConn) bool { return false }
