//go:build race

package netloop

// raceBuild: the race detector learns that one goroutine's write to a
// socket happens before another's read of it from net.Conn's own I/O
// (internal/poll tells it), not from raw system calls; under it the
// router's connections keep net.Conn's I/O (rawsock_linux.go).
const raceBuild = true
