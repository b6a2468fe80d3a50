//go:build !linux

package netloop

import "net"

// RawSock is Linux's raw socket I/O (rawsock_linux.go); elsewhere it is
// never set and connections use net.Conn's Read and Write.
type RawSock struct{}

func (s *RawSock) Set(net.Conn) bool           { return false }
func (s *RawSock) OK() bool                    { return false }
func (s *RawSock) Read(p []byte) (int, error)  { panic("netloop: RawSock not set") }
func (s *RawSock) Write(p []byte) (int, error) { panic("netloop: RawSock not set") }
