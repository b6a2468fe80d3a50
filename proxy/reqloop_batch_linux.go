//go:build linux

package proxy

import (
	"github.com/gpurouter/gpurouter/internal/netloop"
	"golang.org/x/sys/unix"
)

// loopReads makes one wake-up's reads of clients' and engines' sockets —
// requests coming in, whole answers coming back — in one io_uring_enter,
// and the writes they lead to — requests to engines, answers to clients —
// in another, where the loop made a recvfrom(2) or sendto(2) each, as the
// streams' are made (streamBatch, the same ring). At c=64 a wake-up of the
// loop finds about eight requests' sockets ready, a request costs a read
// and a write on each side, and on the 2 vCPU AMD box a system call's
// entry and exit cost about as much as a small socket operation
// (streamBatch).
//
// The loop queues the sockets the wait reported readable (queueRead) and
// makes the reads before it acts on anything else, after the streams'
// (flushReads), so that only distinct connections' reads are reordered,
// never two things of one connection. What each read gave is then taken
// as a read made at once would be (clientRead, upstreamRead), in the
// wait's order, for each connection still the loop's: one taken before it
// may have closed it. Meanwhile a write to a socket with nothing waiting
// for it is kept as one the socket took none of would be — its bytes in
// c.out, to go before any written after them — and made once every read
// is taken (flushWrites), with what follows a write the socket did not
// take whole, or failed, as when EPOLLOUT reports it writable (writable).
//
// Its zero value batches nothing: every read and write is a system call.
type loopReads struct {
	conns []*loopConn // the sockets the wait found readable, in its order
	fds   [loopReadsMax]int
	buf   []byte // the reads' slots, one a socket
	n     [loopReadsMax]int
	err   [loopReadsMax]error

	// taking: the batch's reads are being taken, and a write to a socket
	// with nothing waiting for it is kept for flushWrites.
	taking bool
	sends  []*loopConn
	// The bytes kept, back to back: each socket's c.out is a slice of
	// them, capped at its end, so that a write after it reallocates
	// rather than overwrite the next one's.
	frames []byte
	sn     [netloop.RingBatch]int
	serr   [netloop.RingBatch]error
}

const (
	loopReadBytes  = 256 << 10 // a batch's reads share this much
	loopFrameBytes = 256 << 10 // a write that would take the kept bytes past this is made at once
	// loopReadsMax leaves each read 16 KiB at the least: a request's head
	// and a chat body of a few thousand tokens in one read. A read that
	// fills its slot reads on at once (flushReads).
	loopReadsMax = loopReadBytes / (16 << 10)
)

// openReads readies the loop's read batch when it has a ring (its
// streams' batch has one: streamPump.openBatch).
func (l *requestLoop) openReads() {
	if l.host.batch.ring == nil {
		return
	}
	l.reads = loopReads{conns: make([]*loopConn, 0, loopReadsMax), buf: make([]byte, loopReadBytes),
		sends: make([]*loopConn, 0, netloop.RingBatch), frames: make([]byte, 0, 16<<10)}
}

// queueRead reads c's socket and takes what it gave: in the wake-up's
// batch, or now when there is none.
func (l *requestLoop) queueRead(c *loopConn) {
	t := &l.reads
	if t.buf == nil {
		l.read(c)
		return
	}
	t.fds[len(t.conns)] = c.fd
	t.conns = append(t.conns, c)
	c.reading = true
	if len(t.conns) == loopReadsMax {
		l.flushReads()
	}
}

// read reads c's socket now, into the loop's read buffer.
func (l *requestLoop) read(c *loopConn) {
	if c.up != nil {
		l.readUpstream(c)
	} else {
		l.readClient(c)
	}
}

// flushReads makes the reads queued — the streams' first (their batch
// delivers and writes them), then the clients' and engines' — and takes
// what each gave. A lone read is a system call: in a ring one operation
// costs more than the call.
func (l *requestLoop) flushReads() {
	l.host.flushPulls(l.now)
	t := &l.reads
	q := t.conns
	if len(q) == 0 {
		return
	}
	defer func() {
		clear(q)
		t.conns = q[:0]
	}()
	if len(q) == 1 {
		q[0].reading = false
		if l.still(q[0], t.fds[0]) {
			l.read(q[0])
		}
		return
	}
	slot := len(t.buf) / len(q)
	ring := l.host.batch.ring
	for i, c := range q {
		if !l.still(c, t.fds[i]) {
			// Let go by a stream's end since it was queued.
			c.reading = false
			q[i] = nil
			continue
		}
		ring.Prepare(netloop.OpRecv, c.fd, t.buf[i*slot:(i+1)*slot], i)
	}
	if err := ring.Run(t.result); err != nil {
		// The reads it did not see end failed; the next are system calls.
		l.host.ringFailed(err)
		defer func() { l.reads.buf = nil }()
	}
	l.s.m.requestReads.Add(float64(len(q)))
	t.taking = true
	defer l.flushWrites()
	for i, c := range q {
		if c == nil {
			continue
		}
		c.reading = false
		if !l.still(c, t.fds[i]) {
			continue // closed by what an earlier read gave: its bytes go with it
		}
		// An engine's connection is still no stream's: only its own
		// answer's head makes it one.
		b := t.buf[i*slot : (i+1)*slot]
		if c.up != nil {
			l.upstreamRead(c, b, t.n[i], t.err[i])
		} else {
			l.clientRead(c, b, t.n[i], t.err[i])
		}
		if t.n[i] == slot && l.still(c, t.fds[i]) && c.stream == nil {
			// A read that filled its slot — a long prompt, a long answer
			// — goes on at once into the loop's read buffer, as a read
			// made alone would have, rather than a slot a wake-up.
			l.read(c)
		}
	}
}

// still reports whether c is the loop's connection on fd yet.
func (l *requestLoop) still(c *loopConn, fd int) bool {
	return c.fd == fd && fd >= 0 && l.conns.Get(fd) == c
}

func (t *loopReads) result(i, n int, err error) { t.n[i], t.err[i] = n, err }

// keep keeps p, a write to c's socket while the batch's reads are taken,
// for flushWrites: false when it can't (no batch being taken, bytes
// waiting in c.out already, or the batch full), and the caller writes as
// usual. Nor is a client's write kept while the client may have another
// request before the batch ends — one read ahead of it in this batch, or
// pipelined — since a request the loop hands off (handOff) takes the
// connection, and kept bytes with it would be lost.
//
// A kept answer that then fails (a client reset between the batch's reads
// and its writes) fails after its exchange was finished as written: it is
// counted as served, and the connection closes — as with an answer whose
// socket took part of it and failed at EPOLLOUT. A reset that came before
// the wait is in the batch (reading), and its answer is written at once.
func (l *requestLoop) keep(c *loopConn, p []byte) bool {
	t := &l.reads
	if !t.taking || len(c.out) > 0 || c.batched || len(t.sends) == netloop.RingBatch || len(t.frames)+len(p) > loopFrameBytes {
		return false
	}
	if c.up == nil && (c.reading || c.serving || c.in != nil && c.in.Len() > 0) {
		return false
	}
	at := len(t.frames)
	t.frames = append(t.frames, p...)
	c.out = t.frames[at:len(t.frames):len(t.frames)]
	c.wrote, c.batched = l.now, true
	t.sends = append(t.sends, c)
	return true
}

// flushWrites makes the writes kept while the batch's reads were taken,
// one system call for all, and does what writable does after each.
func (l *requestLoop) flushWrites() {
	t := &l.reads
	t.taking = false
	q := t.sends
	if len(q) == 0 {
		return
	}
	var ops int
	for i, c := range q {
		c.batched = false
		if c.fd < 0 || len(c.out) == 0 {
			q[i] = nil // closed since, or its bytes taken along by a stream's head (streamHead)
			continue
		}
		ops++
	}
	switch ring := l.host.batch.ring; {
	case ops == 1 || ops > 1 && ring == nil: // a lone write, or the ring failed under them
		for i, c := range q {
			if c != nil {
				t.sn[i], t.serr[i] = netloop.Write(c.fd, c.out)
			}
		}
	case ops > 1:
		for i, c := range q {
			if c != nil {
				ring.Prepare(netloop.OpSend, c.fd, c.out, i)
			}
		}
		if err := ring.Run(t.sent); err != nil {
			l.host.ringFailed(err)
		}
		l.s.m.requestWrites.Add(float64(ops))
	}
	for i, c := range q {
		if c != nil && c.fd >= 0 {
			l.wroteKept(c, t.sn[i], t.serr[i])
		}
	}
	clear(q)
	t.sends, t.frames = q[:0], t.frames[:0]
}

// wroteKept does what follows a kept write that took n bytes of c.out, or
// failed with err: as writable, except that c waited for no EPOLLOUT.
func (l *requestLoop) wroteKept(c *loopConn, n int, err error) {
	if err != nil && err != unix.EAGAIN && err != unix.EINTR {
		l.closeConn(c)
		return
	}
	n = max(n, 0)
	if n < len(c.out) {
		// The rest waits for EPOLLOUT, in memory of its own: the kept
		// bytes' is the next batch's.
		c.out = append([]byte(nil), c.out[n:]...)
		l.rewatch(c, unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLOUT)
		return
	}
	c.out = nil
	l.drained(c)
}

func (t *loopReads) sent(i, n int, err error) { t.sn[i], t.serr[i] = n, err }
