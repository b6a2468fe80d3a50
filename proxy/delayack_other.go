//go:build !linux

package proxy

import "net"

// delayAcks is Linux's (delayack_linux.go): elsewhere connections keep
// the kernel's default.
func delayAcks(net.Conn) {}
