//go:build linux

package proxy

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// BenchmarkRequestLoopClients is BenchmarkRequestLoop with k clients at
// once, each on its own connection, one request in flight each: the
// loop's wake-ups find several sockets ready, whose reads and writes it
// batches (reqloop_batch_linux.go) unless upstream.unbatched_io. ns/op is
// per request, allocs/op too (the clients allocate nothing).
func BenchmarkRequestLoopClients(b *testing.B) {
	reply := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(harnessReply)) + "\r\n\r\n" + string(harnessReply)
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(harnessRequest)) + "\r\n\r\n" + harnessRequest)
	for _, unbatched := range []bool{false, true} {
		for _, k := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("unbatched=%v/clients=%d", unbatched, k), func(b *testing.B) {
				engine := rawEngine(b, reply)
				tr := startRouterWith(b, []string{engine}, nil, oneLoop, withPolicy("least_request"),
					withConfig(func(c *Config) { c.UnbatchedIO = unbatched }))
				conns := make([]net.Conn, k)
				for i := range conns {
					c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(time.Minute)) //nolint:errcheck
					conns[i] = c
				}
				var left atomic.Int64
				left.Store(int64(b.N))
				errs := make(chan error, k)
				b.ReportAllocs()
				b.ResetTimer()
				var wg sync.WaitGroup
				for _, c := range conns {
					wg.Go(func() {
						buf := make([]byte, 64<<10)
						var end h1.ResponseEnd
						for left.Add(-1) >= 0 {
							if _, err := c.Write(req); err != nil {
								errs <- err
								return
							}
							end.Reset()
							for done := false; !done; {
								n, err := c.Read(buf)
								if err != nil {
									errs <- err
									return
								}
								if _, done, err = end.Feed(buf[:n]); err != nil {
									errs <- err
									return
								}
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
			})
		}
	}
}
