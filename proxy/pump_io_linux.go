//go:build linux

package proxy

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// One stream's bytes through the loop (pump_linux.go): read off the
// engine's socket, unframed, processed by the relay, written to the client.

// rawRead and rawWrite read and write a non-blocking socket as raw
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
func rawRead(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func rawWrite(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// writeFrame is the loop's write of b.frame to the client's socket, made
// a method value once (detach) so that a write allocates nothing. It never
// waits: a socket that takes less goes back to the goroutine (send).
func (b *detachedBody) writeFrame(fd uintptr) bool {
	b.wn, b.werr = rawWrite(int(fd), b.frame)
	return true
}

// pull reads what b's upstream has, up to the relay's room for it (as
// relay.fill reads), and delivers it.
func (p *streamPump) pull(b *detachedBody, now time.Time) {
	r := b.r
	if r.buf == nil {
		r.takeBufFrom(&p.bufs)
	}
	if len(r.in) == cap(r.in) && !p.grow(b) {
		return
	}
	n, err := rawRead(b.pfd, p.buf[:min(cap(r.in)-len(r.in), len(p.buf))])
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		if len(r.in) == 0 {
			r.putBufTo(&p.bufs)
		}
		return
	case err != nil:
		p.deliver(b, nil, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", err)}, now)
	case n == 0:
		p.deliver(b, nil, io.EOF, now)
	default:
		p.deliver(b, p.buf[:n], nil, now)
	}
}

// grow makes room in a full relay buffer as relay.fill does: false when
// the event outgrew maxEventBytes (the stream then ends, handed back).
func (p *streamPump) grow(b *detachedBody) bool {
	r := b.r
	if len(r.in) >= maxEventBytes {
		r.fail(fmt.Errorf("%w: event larger than %d bytes", ErrUpstream, maxEventBytes)) // as relay.fill
		if p.send(b) {
			p.release(b, pumpResult{}, exitUpstreamError)
		}
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
	for len(raw) > 0 && readErr == nil && !b.dec.done() {
		if r.buf == nil {
			r.takeBufFrom(&p.bufs)
		}
		if len(r.in) == cap(r.in) {
			r.process(p.at)
			if len(r.in) == cap(r.in) && !p.grow(b) {
				return
			}
		}
		n, used, err := b.dec.decode(r.in[len(r.in):cap(r.in)], raw)
		raw = raw[used:]
		r.in = r.in[:len(r.in)+n]
		if n > 0 {
			r.gotBody = true
		}
		readErr = err
	}
	if readErr == nil && b.dec.done() {
		readErr = io.EOF // the last chunk: the engine's response is over
		b.extra = len(raw) > 0
	}
	r.process(p.at)
	if readErr == io.EOF && b.dec.done() && r.sawDone && !r.eof && r.abortErr.Load() == nil {
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
		if p.send(b) {
			why := exitUpstreamError
			if readErr == io.EOF {
				why = exitEnd
			}
			p.release(b, pumpResult{readErr: readErr}, why)
		}
		return
	}
	b.deadline = now.Add(b.limit())
	x := r.x
	if x.s.exceededAt(x, p.at) {
		r.fail(fmt.Errorf("%w: total request deadline", ErrTimeout)) // as relay.afterRead
	} else if m := x.mig; m != nil && m.pol.DrainGrace > 0 && m.off == nil && !r.eof && m.leaving(x, p.at) {
		p.release(b, pumpResult{leaving: true}, exitLeaving)
		return
	}
	if !p.send(b) {
		return
	}
	if r.eof { // the total deadline ended it
		p.release(b, pumpResult{}, exitTimeout)
		return
	}
	if len(r.in) == 0 {
		r.putBufTo(&p.bufs) // nothing partial: the stream waits without buffers
	}
}

// send writes the relay's processed events to the client as one chunk,
// now, without blocking; false when the stream was handed back (the
// client's socket is full, or the client is gone).
func (p *streamPump) send(b *detachedBody) bool {
	r := b.r
	data := r.out[r.outPos:]
	if len(data) == 0 {
		return true
	}
	f := strconv.AppendInt(p.frame[:0], int64(len(data)), 16)
	f = append(f, "\r\n"...)
	f = append(f, data...)
	f = append(f, "\r\n"...)
	p.frame = f
	if b.cfd >= 0 {
		// The client's descriptor itself, not through its RawConn, whose
		// Write takes the descriptor's lock and resets its poll state
		// every event: while the stream is in the loop nothing else
		// writes to the connection or closes it — its goroutine waits in
		// take, and the server's shutdown closes only connections waiting
		// for a request — as the set's registration of cfd already relies on.
		b.wn, b.werr = rawWrite(b.cfd, f)
	} else {
		b.frame = f
		if err := b.client.Write(b.write); err != nil {
			b.wn, b.werr = 0, err
		}
	}
	n, werr := max(b.wn, 0), b.werr
	b.frame, b.werr = nil, nil
	r.out, r.outPos = r.out[:0], 0
	switch {
	case n == len(f):
		return true
	case werr == nil || werr == unix.EAGAIN:
		p.release(b, pumpResult{unsent: append([]byte(nil), f[n:]...)}, exitSlowClient)
	default:
		p.release(b, pumpResult{clientErr: werr}, exitClientGone)
	}
	return false
}
