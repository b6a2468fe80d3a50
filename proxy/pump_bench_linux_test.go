//go:build linux

package proxy

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/internal/netloop"
	"github.com/gpurouter/gpurouter/internal/netloop/looptest"
	"github.com/gpurouter/gpurouter/internal/openai"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// BenchmarkStreamLoopDeliver is the stream loop's work for one event that
// arrived alone, as a stream's events do (one read each, milliseconds
// apart): take off the chunked framing, process the event, write the
// client's chunk to a loopback socket (read back by the benchmark);
// ns/op and allocs/op are per event. The exchange is migratable, as by
// default, so the tracking of every event is in it. "fd" writes to the
// client's descriptor, as the loop does once it watches the client for
// hang-ups; "rawconn" through the connection's RawConn, as it does when
// it could not.
func BenchmarkStreamLoopDeliver(b *testing.B) {
	for _, direct := range []bool{true, false} {
		name := "rawconn"
		if direct {
			name = "fd"
		}
		b.Run(name, func(b *testing.B) { benchStreamLoopDeliver(b, direct) })
	}
}

func benchStreamLoopDeliver(b *testing.B, direct bool) {
	craw, _, peer := looptest.RawPair(b)
	s := &Server{cfg: Config{}.withDefaults(), now: time.Now}
	x := &exchange{s: s, ep: openai.Chat, received: time.Now()}
	x.mig = &migration{chat: true, idsOK: true, strip: true, pol: Migration{MaxSeqLen: 1 << 30}, buf: migBufPool.Get().(*migBuffers)}
	x.mig.buf.reset()
	r := &relay{x: x}
	p := &streamPump{at: time.Now()}
	d := &detachedBody{pump: p, r: r, client: craw, fd: -1, cfd: -1, to: &timeouts{idle: time.Minute}}
	d.write = d.writeFrame
	if direct {
		if err := craw.Control(func(fd uintptr) { d.cfd = int(fd) }); err != nil {
			b.Fatal(err)
		}
	}
	r.gotBody = true
	ev := chunk(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	raw := []byte(ev)
	sink := make([]byte, 4096)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p.deliver(d, raw, nil, p.at)
		if _, err := peer.Read(sink); err != nil {
			b.Fatal(err)
		}
		if i%4096 == 4095 { // the tracked text grows: start it over, as a new stream would
			x.mig.buf.reset()
		}
	}
	if _, err := io.ReadFull(peer, sink[:0]); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStreamLoopWakeUp is one wake-up of a stream loop that finds k
// streams with an event each: the reads, the events' processing and the
// writes to k clients — batched, two io_uring_enter calls for all
// (pump_batch_linux.go), or unbatched, a recvfrom and a sendto each. The
// benchmark's own engine writes and client reads (2k system calls an op)
// are in ns/op for both; ns/event is ns/op over k. Skipped batched where
// the kernel refuses io_uring.
func BenchmarkStreamLoopWakeUp(b *testing.B) {
	for _, k := range []int{1, 2, 4, 8, 16} {
		for _, batched := range []bool{false, true} {
			name := fmt.Sprintf("streams=%d/unbatched", k)
			if batched {
				name = fmt.Sprintf("streams=%d/batched", k)
			}
			b.Run(name, func(b *testing.B) { benchStreamLoopWakeUp(b, k, batched) })
		}
	}
}

func benchStreamLoopWakeUp(b *testing.B, k int, batched bool) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	s := &Server{cfg: Config{}.withDefaults(), now: time.Now}
	s.cfg.UnbatchedIO = !batched
	p := newStreamPump(s.cfg, m, nil, func(err error) { b.Skipf("io_uring refused by this kernel: %v", err) })
	p.streams, p.buf, p.at = netloop.FDTable[detachedBody]{}, make([]byte, 64<<10), time.Now()
	p.openBatch()
	b.Cleanup(p.closeBatch)
	engines, clients := make([]int, k), make([]int, k)
	events := make([]unix.EpollEvent, k)
	for i := range k {
		up, engine := looptest.SocketPair(b)
		cfd, client := looptest.SocketPair(b)
		r := &relay{x: &exchange{s: s, ep: openai.Chat, received: time.Now()}, gotBody: true}
		d := &detachedBody{pump: p, r: r, fd: up, pfd: up, cfd: cfd, to: &timeouts{idle: time.Minute}, back: make(chan pumpResult, 1), in: true, inPump: true}
		r.body = d
		p.streams.Set(up, d)
		engines[i], clients[i] = engine, client
		events[i] = unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(up)}
	}
	ev := []byte(chunk(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}` + "\n\n"))
	sink := make([]byte, 4096)
	b.ReportAllocs()
	for b.Loop() {
		for _, fd := range engines {
			if _, err := netloop.Write(fd, ev); err != nil {
				b.Fatal(err)
			}
		}
		p.dispatch(events, p.at)
		for _, fd := range clients {
			if n, err := netloop.Read(fd, sink); err != nil || n == 0 {
				b.Fatalf("a client read %d bytes (%v): its stream left the loop", n, err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*k), "ns/event")
}
