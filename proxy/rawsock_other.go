//go:build !linux

package proxy

import "net"

// rawSock is Linux's raw socket I/O (rawsock_linux.go); elsewhere it is
// never set and connections use net.Conn's Read and Write.
type rawSock struct{}

func (s *rawSock) set(net.Conn) bool           { return false }
func (s *rawSock) ok() bool                    { return false }
func (s *rawSock) read(p []byte) (int, error)  { panic("proxy: rawSock not set") }
func (s *rawSock) write(p []byte) (int, error) { panic("proxy: rawSock not set") }
