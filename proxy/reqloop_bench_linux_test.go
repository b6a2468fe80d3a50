//go:build linux

package proxy

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/internal/h1"
)

// BenchmarkRequestLoop is one whole request of the harness's sizes
// (bench proxy-cost: 300 B in, 500 B out) through a request loop, over
// loopback sockets, one after another on one kept-alive connection: the
// client and the engine are raw sockets that allocate nothing, so the
// allocations reported are the router's. Its time includes both ends'
// system calls.
func BenchmarkRequestLoop(b *testing.B) {
	reply := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(harnessReply)) + "\r\n\r\n" + string(harnessReply)
	engine := rawEngine(b, reply)
	tr := startRouterWith(b, []string{engine}, nil, oneLoop, withPolicy("least_request"))
	c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(harnessRequest)) + "\r\n\r\n" + harnessRequest)
	buf := make([]byte, 64<<10)
	var end h1.ResponseEnd
	c.SetDeadline(time.Now().Add(time.Minute)) //nolint:errcheck
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		end.Reset()
		for done := false; !done; {
			n, err := c.Read(buf)
			if err != nil {
				b.Fatal(err)
			}
			if _, done, err = end.Feed(buf[:n]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// rawEngine answers every request on its connections with reply, reading
// requests by their framing into one buffer: it allocates nothing per
// request. It stops with the benchmark.
func rawEngine(tb testing.TB, reply string) string {
	tb.Helper()
	out := []byte(reply)
	return loopbackServer(tb, func(c net.Conn) {
		buf := make([]byte, 64<<10)
		have := 0
		for {
			n, err := c.Read(buf[have:])
			if err != nil {
				return
			}
			have += n
			for {
				m := h1.RequestLen(buf[:have], 0)
				if m <= 0 || m > have {
					break
				}
				if _, err := c.Write(out); err != nil {
					return
				}
				have = copy(buf, buf[m:have])
			}
		}
	})
}
