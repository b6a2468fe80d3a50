//go:build linux

package proxy

import (
	"github.com/gpurouter/gpurouter/internal/netloop"
	"time"
)

// streamBatch makes one wake-up's stream reads in one system call, then
// their writes in another (netloop.Ring), where the loop would make two a
// stream: a stream's event costs its read and its write, and with 64
// streams a wake-up finds about five ready. The loop queues the streams
// the wait reported ready (queuePull), and makes the batch before it
// touches anything else — a client's hang-up, a request, the scan — and
// at the wake-up's end (flushPulls), so that only the reads and writes of
// distinct streams are reordered, never two things of one connection.
// Each stream's relay is as without the batch (pulled, deliver); its
// write is queued (queueSend) and what follows it waits for the write's
// result (afterSend).
//
// Its zero value batches nothing: every read and write is a system call.
type streamBatch struct {
	ring *netloop.Ring
	// spent is a ring that failed (ringFailed): kept, never used or
	// closed, with the buffers the kernel may still write to.
	spent  *netloop.Ring
	pulls  []*detachedBody // the streams the wait found ready, in its order
	rbuf   []byte          // the reads' slots, one a stream
	sends  []batchSend
	frames []byte // the queued chunks, back to back
	// delivering: a batch's reads are being delivered, their writes
	// queued (queueSend); any other write is made at once.
	delivering bool
	n          [netloop.RingBatch]int   // each operation's bytes
	err        [netloop.RingBatch]error // or its error
}

// batchSend is one stream's chunk in the batch's frames.
type batchSend struct {
	b       *detachedBody
	at, end int
	then    afterSend
}

const (
	batchReadBytes  = 128 << 10 // a batch's reads share this much: 4 KiB a read at the most streams
	batchFrameBytes = 256 << 10 // a chunk that would take the batch's frames past this is written at once
)

// openBatch readies the loop's batch, on the loop's goroutine as it
// starts: a ring, unless the batch is off (Config.UnbatchedIO) or the
// kernel refuses one (batchOff hears why).
func (p *streamPump) openBatch() {
	if p.unbatched {
		return
	}
	ring, err := netloop.OpenRing()
	if err != nil {
		if p.batchOff != nil {
			p.batchOff(err)
		}
		return
	}
	p.batch = streamBatch{ring: ring, rbuf: make([]byte, batchReadBytes), pulls: make([]*detachedBody, 0, netloop.RingBatch), sends: make([]batchSend, 0, netloop.RingBatch)}
}

// ringFailed stops the batch for good after the ring failed (err, from
// netloop.Ring.Run): every read and write is a system call from now on, as
// where the kernel refuses io_uring, and batchOff hears why.
func (p *streamPump) ringFailed(err error) {
	t := &p.batch
	if t.ring == nil {
		return
	}
	t.spent, t.ring = t.ring, nil
	if p.batchOff != nil {
		p.batchOff(err)
	}
}

// closeBatch lets the ring go: the loop stops.
func (p *streamPump) closeBatch() {
	p.batch.ring.Close()
	p.batch = streamBatch{}
}

// queuePull reads b's upstream and delivers it: in the wake-up's batch,
// or now when there is none.
func (p *streamPump) queuePull(b *detachedBody, now time.Time) {
	if p.batch.ring == nil {
		p.pull(b, now)
		return
	}
	p.batch.pulls = append(p.batch.pulls, b)
	if len(p.batch.pulls) == netloop.RingBatch {
		p.flushPulls(now)
	}
}

// flushPulls makes the queued reads, delivers what each gave, and makes
// the writes that queued. A lone read is a system call, as is a lone
// write: in a ring one operation costs more than the call.
func (p *streamPump) flushPulls(now time.Time) {
	t := &p.batch
	q := t.pulls
	switch len(q) {
	case 0:
		return
	case 1:
		b := q[0]
		q[0], t.pulls = nil, q[:0]
		p.pull(b, now)
		return
	}
	slot := len(t.rbuf) / len(q)
	for i, b := range q {
		room, ok := p.readRoom(b, slot)
		if !ok {
			q[i] = nil // handed back (grow)
			continue
		}
		t.ring.Prepare(netloop.OpRecv, b.pfd, t.rbuf[i*slot:i*slot+room], i)
	}
	if err := t.ring.Run(t.result); err != nil {
		p.ringFailed(err) // the reads it did not see end failed
	}
	p.batchedReads.Add(float64(len(q)))
	t.delivering = true
	for i, b := range q {
		if b != nil {
			p.pulled(b, t.rbuf[i*slot:], t.n[i], t.err[i], now)
		}
	}
	t.delivering = false
	clear(q)
	t.pulls = q[:0]
	p.flushSends()
}

func (t *streamBatch) result(i, n int, err error) { t.n[i], t.err[i] = n, err }

// queueSend queues b's events as one chunk for the batch's writes, then
// to do then: true when it did; false when there is no batch being
// delivered, or the chunk is too large for it (the caller writes it now).
func (t *streamBatch) queueSend(b *detachedBody, data []byte, then afterSend) bool {
	if !t.delivering || b.cfd < 0 || len(t.sends) == netloop.RingBatch || len(t.frames)+len(data)+32 > batchFrameBytes {
		return false
	}
	at := len(t.frames)
	t.frames = appendChunk(t.frames, data)
	t.sends = append(t.sends, batchSend{b: b, at: at, end: len(t.frames), then: then})
	return true
}

// flushSends makes the queued writes and does what follows each.
func (p *streamPump) flushSends() {
	t := &p.batch
	q := t.sends
	switch {
	case len(q) == 0:
		return
	case len(q) == 1 || t.ring == nil: // a lone write, or the ring failed under them
		for i, s := range q {
			n, err := netloop.Write(s.b.cfd, t.frames[s.at:s.end])
			t.n[i], t.err[i] = max(n, 0), err
		}
	default:
		for i, s := range q {
			t.ring.Prepare(netloop.OpSend, s.b.cfd, t.frames[s.at:s.end], i)
		}
		if err := t.ring.Run(t.result); err != nil {
			p.ringFailed(err)
		}
		p.batchedWrites.Add(float64(len(q)))
	}
	for i, s := range q {
		p.wrote(s.b, t.frames[s.at:s.end], t.n[i], t.err[i], s.then)
	}
	clear(q)
	t.sends, t.frames = q[:0], t.frames[:0]
}
