//go:build linux

package proxy

import (
	"io"
	"testing"
	"time"
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
	craw, _, peer := rawPair(b)
	s := &Server{cfg: Config{}.withDefaults(), now: time.Now}
	x := &exchange{s: s, ep: epChat, received: time.Now()}
	x.mig = &migration{chat: true, idsOK: true, strip: true, pol: Migration{MaxSeqLen: 1 << 30}, buf: migBufPool.Get().(*migBuffers)}
	x.mig.buf.reset()
	r := &relay{x: x}
	p := &streamPump{at: time.Now(), idle: time.Minute}
	d := &detachedBody{pump: p, r: r, client: craw, fd: -1, cfd: -1, idle: time.Minute}
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
