//go:build unix

package proxy

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// closedPort returns a loopback URL that refuses connections: a socket
// bound to its port and never listening, held until the test ends. A
// listener opened and closed to find a free port would leave the port
// free for the next listener the test starts — a fake engine that then
// answers at the "refused" address (seen once in CI).
func closedPort(t *testing.T) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0) // no SOCK_CLOEXEC on darwin
	if err != nil {
		t.Fatal(err)
	}
	unix.CloseOnExec(fd)
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port)
}
