//go:build !unix

package proxy

import (
	"net"
	"testing"
)

// closedPort returns a loopback URL nobody listens on: a port a listener
// had and gave up (on Unix a bound socket holds it: closedport_unix_test.go).
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}
