//go:build !linux

package sim

import "net"

// peerClosed is only implemented on Linux; elsewhere disconnects are noticed
// on the first failed write.
func peerClosed(net.Conn) bool { return false }
