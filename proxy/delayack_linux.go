//go:build linux

package proxy

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Delayed ACKs on the engines' connections. A stream's events reach the
// router as small pushed segments, and Linux acknowledges each one as
// soon as the router has read it — unless the connection is in its
// "pingpong" (interactive) mode, where it acknowledges every second one,
// or with the next bytes the router sends. A keep-alive connection enters
// that mode by itself once the router sends it a request soon after an
// answer, so only a fresh connection's first stream pays an ACK segment
// per event: on a loopback engine each one a trip through both TCP stacks
// on the router's CPU, on a remote one a packet each way on the wire.
// Every engine connection starts in that mode instead (TCP_QUICKACK 0,
// as HAProxy's tcp-smart-connect sets it). In `bench proxy-cost`'s SSE
// run, whose 64 engine connections are dialed afresh for each run, the
// router sent 0.58 ACK segments per event before and 0.50 after (nginx,
// whose upstream connections persist across runs: 0.49).
//
// It changes when the engine learns that bytes arrived, never when they
// are relayed: the kernel still acknowledges at once what exceeds a
// segment, and within its delayed-ACK timeout (40 ms) what does not; a
// timeout that fires leaves the mode, and the kernel's own rules apply
// from then on, as on any connection. An engine that leaves Nagle's
// algorithm on (no TCP_NODELAY) holds its second small event until the
// first is acknowledged, so in this mode a stream may wait once for that
// timeout before the kernel leaves it — as it already did at the start of
// every stream on a reused connection, which the kernel puts in this mode
// by itself; vLLM and SGLang (uvicorn) set TCP_NODELAY.

// delayAcks puts c's socket in delayed-ACK mode. Best effort: a
// connection that is not a socket, or a socket that refuses, keeps the
// kernel's default.
func delayAcks(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) { //nolint:errcheck // best effort, as above
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0) //nolint:errcheck
	})
}
