//go:build linux

package netloop

import (
	"net"
	"os"
	"testing"

	"github.com/gpurouter/gpurouter/internal/netloop/looptest"

	"golang.org/x/sys/unix"
)

// BenchmarkGiveBackUpstream is what giving a stream's upstream socket back
// to Go's netpoller costs (detachedBody), from the loop's descriptor to a
// net.Conn and, for both, its Close: net.FileConn as before, FileConn now.
// The socket is a duplicate of a loopback connection's, made each time
// (F_DUPFD_CLOEXEC, as detach makes it; a few hundred ns of either).
func BenchmarkGiveBackUpstream(b *testing.B) {
	// Not rawPair: a RawConn of known type keeps dup's closure off the
	// heap, so allocs/op are the give-back's own.
	c, _ := looptest.TCPPair(b, nil)
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	dup := func() int {
		fd := -1
		if err := rc.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || fd < 0 {
			b.Fatal(err)
		}
		return fd
	}
	b.Run("net.FileConn", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			f := os.NewFile(uintptr(dup()), "upstream")
			fc, err := net.FileConn(f)
			f.Close()
			if err != nil {
				b.Fatal(err)
			}
			fc.Close()
		}
	})
	b.Run("FileConn", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			NewFileConn(dup(), c.LocalAddr(), c.RemoteAddr()).Close()
		}
	})
}
