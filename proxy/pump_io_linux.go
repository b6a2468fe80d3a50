//go:build linux

package proxy

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/internal/netloop"
	"golang.org/x/sys/unix"
)

// One stream's bytes through the loop (pump_linux.go): read off the
// engine's socket, unframed, processed by the relay, written to the client.

// writeFrame is the loop's write of b.frame to the client's socket, made
// a method value once (detach) so that a write allocates nothing. It never
// waits: a socket that takes less goes back to the goroutine (send).
func (b *detachedBody) writeFrame(fd uintptr) bool {
	b.wn, b.werr = netloop.Write(int(fd), b.frame)
	return true
}

// pull reads what b's upstream has, up to the relay's room for it (as
// relay.fill reads), and delivers it.
func (p *streamPump) pull(b *detachedBody, now time.Time) {
	room, ok := p.readRoom(b, len(p.buf))
	if !ok {
		return
	}
	n, err := netloop.Read(b.pfd, p.buf[:room])
	p.pulled(b, p.buf, n, err, now)
}

// readRoom readies b's relay buffer for a read: how much the read may
// take, at most limit; false when b left the loop instead (grow).
func (p *streamPump) readRoom(b *detachedBody, limit int) (int, bool) {
	r := b.r
	if r.buf == nil {
		r.takeBufFrom(&p.bufs)
	}
	if len(r.in) == cap(r.in) && !p.grow(b) {
		return 0, false
	}
	return min(cap(r.in)-len(r.in), limit), true
}

// pulled delivers what a read of b's upstream gave: n bytes at the start
// of buf, or err.
func (p *streamPump) pulled(b *detachedBody, buf []byte, n int, err error, now time.Time) {
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		if len(b.r.in) == 0 {
			b.r.putBufTo(&p.bufs)
		}
	case err != nil:
		p.deliver(b, nil, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", err)}, now)
	case n == 0:
		p.deliver(b, nil, io.EOF, now)
	default:
		p.deliver(b, buf[:n], nil, now)
	}
}

// grow makes room in a full relay buffer as relay.fill does: false when
// the event outgrew maxEventBytes (the stream then ends, handed back).
func (p *streamPump) grow(b *detachedBody) bool {
	r := b.r
	if len(r.in) >= maxEventBytes {
		r.fail(fmt.Errorf("%w: event larger than %d bytes", ErrUpstream, maxEventBytes)) // as relay.fill
		p.send(b, afterSend{release: true, why: exitUpstreamError})
		return false
	}
	grown := make([]byte, len(r.in), 2*cap(r.in)+relayBufSize)
	copy(grown, r.in)
	r.buf, r.in = grown, grown
	return true
}

// deliver takes raw upstream bytes through b's decoder into its relay and
// passes the events on; readErr is how the read ended (nil: it delivered).
func (p *streamPump) deliver(b *detachedBody, raw []byte, readErr error, now time.Time) {
	r := b.r
	if r.x.firstTok.IsZero() && r.x.admissionWaiting() { // the first token may let queued requests out
		defer func() { p.yield = p.yield || !r.x.firstTok.IsZero() }()
	}
	for len(raw) > 0 && readErr == nil && !b.dec.Done() {
		if r.buf == nil {
			r.takeBufFrom(&p.bufs)
		}
		if len(r.in) == cap(r.in) {
			r.process(p.at)
			if len(r.in) == cap(r.in) && !p.grow(b) {
				return
			}
		}
		n, used, err := b.decode(r.in[len(r.in):cap(r.in)], raw)
		raw = raw[used:]
		r.in = r.in[:len(r.in)+n]
		if n > 0 {
			r.gotBody = true
		}
		readErr = err
	}
	if readErr == nil && b.dec.Done() {
		readErr = io.EOF // the last chunk: the engine's response is over
		b.extra = len(raw) > 0
	}
	r.process(p.at)
	if readErr == io.EOF && b.dec.Done() && r.sawDone && !r.eof && r.abortErr.Load() == nil {
		// A clean end: its last events ([DONE] among them) go back with
		// the stream, and the goroutine writes them with the body's last
		// chunk, one write(2) for both (writeChunked). Their timings are
		// taken; they wait for the goroutine's wake-up only.
		p.release(b, pumpResult{readErr: readErr}, exitEnd)
		return
	}
	if readErr != nil {
		// The events before the end go out now (the engine's last ones,
		// an error event among them), not when the goroutine next runs.
		why := exitUpstreamError
		if readErr == io.EOF {
			why = exitEnd
		}
		p.send(b, afterSend{release: true, res: pumpResult{readErr: readErr}, why: why})
		return
	}
	b.deadline = now.Add(b.limit())
	if r.afterEvents(p.at) {
		p.release(b, pumpResult{leaving: true}, exitLeaving)
		return
	}
	p.send(b, afterSend{})
}

// afterSend is what a stream's relay does once its events are written:
// go on in the loop (the zero value), or hand the stream back (release)
// with res, for why.
type afterSend struct {
	release bool
	res     pumpResult
	why     loopExit
}

// send writes the relay's processed events to the client as one chunk,
// without blocking, then does then: now, or — while a batch of reads is
// delivered (streamBatch) — once the batch's writes are made. A client
// whose socket is full, or gone, has the stream handed back instead.
func (p *streamPump) send(b *detachedBody, then afterSend) {
	r := b.r
	data := r.out[r.outPos:]
	if len(data) == 0 {
		p.sent(b, then)
		return
	}
	if p.batch.queueSend(b, data, then) {
		r.out, r.outPos = r.out[:0], 0
		return
	}
	f := appendChunk(p.frame[:0], data)
	p.frame = f
	if b.cfd >= 0 {
		// The client's descriptor itself, not through its RawConn, whose
		// Write takes the descriptor's lock and resets its poll state
		// every event: while the stream is in the loop nothing else
		// writes to the connection or closes it — its goroutine waits in
		// take, and the server's shutdown closes only connections waiting
		// for a request — as the set's registration of cfd already relies on.
		b.wn, b.werr = netloop.Write(b.cfd, f)
	} else {
		b.frame = f
		if err := b.client.Write(b.write); err != nil {
			b.wn, b.werr = 0, err
		}
	}
	n, werr := max(b.wn, 0), b.werr
	b.frame, b.werr = nil, nil
	r.out, r.outPos = r.out[:0], 0
	p.wrote(b, f, n, werr, then)
}

// appendChunk appends data framed as one HTTP/1.1 chunk.
func appendChunk(dst, data []byte) []byte {
	dst = strconv.AppendInt(dst, int64(len(data)), 16)
	dst = append(dst, "\r\n"...)
	dst = append(dst, data...)
	return append(dst, "\r\n"...)
}

// wrote takes how the write of chunk f went: n bytes of it, then werr.
func (p *streamPump) wrote(b *detachedBody, f []byte, n int, werr error, then afterSend) {
	switch {
	case n == len(f):
		p.sent(b, then)
	case werr == nil || werr == unix.EAGAIN:
		p.release(b, pumpResult{unsent: append([]byte(nil), f[n:]...)}, exitSlowClient)
	default:
		p.release(b, pumpResult{clientErr: werr}, exitClientGone)
	}
}

// sent does then, b's events all written.
func (p *streamPump) sent(b *detachedBody, then afterSend) {
	r := b.r
	switch {
	case then.release:
		p.release(b, then.res, then.why)
	case r.eof: // the total deadline ended it
		p.release(b, pumpResult{}, exitTimeout)
	case len(r.in) == 0:
		r.putBufTo(&p.bufs) // nothing partial: the stream waits without buffers
	}
}
