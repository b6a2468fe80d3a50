//go:build linux

package netloop

import (
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read and Write read and write a non-blocking socket as raw
// system calls: they never wait, so the runtime need not be told
// (entersyscall), which would let it take the loop's P away while a write
// runs the loopback's receive path, and make the loop win it back. They
// are recvfrom(2) and sendto(2) rather than read(2) and write(2), which
// reach the socket through the file layer: perf put vfs_read, vfs_write
// and their checks at about 0.4 µs an SSE event that nginx, using recv(2)
// and writev(2), does not spend; a loopback write and read pair measured
// 0.2–0.5 µs less this way (30 interleaved runs, quartile and median).
// MSG_NOSIGNAL: a write to a client gone fails with EPIPE and raises no
// SIGPIPE.
func Read(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func Write(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// Dup duplicates c's descriptor (non-blocking, as Go made it).
func Dup(c net.Conn) (int, bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return -1, false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return -1, false
	}
	fd := -1
	var dupErr error
	if err := raw.Control(func(s uintptr) { fd, dupErr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || dupErr != nil || fd < 0 {
		return -1, false
	}
	return fd, true
}
