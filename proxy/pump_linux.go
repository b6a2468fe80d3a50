//go:build linux

package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// The stream loop. A stream spends its life waiting for the engine's next
// event, then moving it to the client: on a goroutine of its own, every
// event costs the Go scheduler a park and a wake, a read that finds
// nothing, fasthttp's buffered chunk parsing and a deadline's clock read —
// half again the CPU a proxy doing its own I/O spends per event (`gpurouter
// bench proxy-cost`, the epoll-bare column). So once a stream's head is
// out, its upstream socket leaves fasthttp and Go's netpoller for one
// epoll set that a single goroutine waits on: each wake-up reads every
// stream that has bytes, takes off the chunked framing (chunked.go), runs
// the relay's own event processing (relay.process: timings, usage, the
// migration's tracking) and writes the events to the client's socket at
// once, as one chunk, without blocking.
//
// The loop only ever does the steady part. Whatever needs waiting or a
// decision — a client whose socket is full, the upstream's end or failure
// (a migration may follow), a timeout, an abort, a replica leaving its
// pool, the loop stopping — hands the stream back to its own goroutine,
// which goes on as the goroutine relay (relay.go) with the socket wrapped
// for Go's netpoller again: nothing is decided twice, or differently.

// streamPump is the stream loop. Its zero value is not usable: newStreamPump.
type streamPump struct {
	firstByte, idle time.Duration
	in              prometheus.Counter
	out             [loopExits]prometheus.Counter // by loopExit

	mu       sync.Mutex
	running  bool            // open: streams may be handed over
	looping  bool            // Run's goroutine runs the loop
	ep, wake int             // the epoll set and the eventfd that wakes it (valid while running)
	incoming []*detachedBody // handed over (take), not yet in the set
	aborts   []*detachedBody // closed from outside while in the loop
	spare    [2][]*detachedBody

	// The loop's own, touched by Run's goroutine only.
	streams  map[int]*detachedBody // by upstream descriptor
	buf      []byte                // every read lands here, and is decoded before the next
	frame    []byte                // a chunk being written to a client
	events   []unix.EpollEvent
	lastScan time.Time
	yield    bool // this round made goroutines runnable
}

// pumpScan is how often the loop looks for streams past their first-byte
// or idle timeout: each fires at most this late.
const pumpScan = 100 * time.Millisecond

func newStreamPump(cfg Config, m *metrics) *streamPump {
	p := &streamPump{firstByte: cfg.FirstByteTimeout, idle: cfg.IdleTimeout, ep: -1, wake: -1, in: m.loopIn}
	for e := range p.out {
		p.out[e] = m.loopOut.WithLabelValues(loopExit(e).String())
	}
	return p
}

// loopExit is why a stream left the loop (gpurouter_stream_loop_exits_total).
type loopExit uint8

const (
	exitEnd loopExit = iota
	exitUpstreamError
	exitTimeout
	exitSlowClient
	exitClientGone
	exitAborted
	exitLeaving
	exitStopped
	loopExits
)

func (e loopExit) String() string {
	return [...]string{"end", "upstream_error", "timeout", "slow_client", "client_gone", "aborted", "leaving", "stopped"}[e]
}

// open readies the loop to take streams (its epoll set, its wake-up), so
// that streams handed over before Run's goroutine first runs wait for it
// instead of missing the loop: Serve opens it before accepting. Opening
// an open loop does nothing.
func (p *streamPump) open() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		return nil
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ep)
		return err
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return err
	}
	p.running, p.ep, p.wake = true, ep, wake
	return nil
}

// Run runs the loop until ctx ends (opening it first, unless it is open),
// then hands every stream in it back to its goroutine and closes it. A
// second Run while one runs returns at once.
func (p *streamPump) Run(ctx context.Context) error {
	if err := p.open(); err != nil {
		return err
	}
	p.mu.Lock()
	if p.looping {
		p.mu.Unlock()
		return nil
	}
	p.looping = true
	p.mu.Unlock()
	p.streams = make(map[int]*detachedBody)
	p.buf = make([]byte, 64<<10)
	p.events = make([]unix.EpollEvent, 256)
	defer p.stop()
	stopWatch := context.AfterFunc(ctx, p.poke)
	defer stopWatch()

	for ctx.Err() == nil {
		n, err := p.wait()
		if err != nil {
			if !errors.Is(err, unix.EINTR) { // a signal: the runtime preempting the loop
				return err
			}
			n = 0
		}
		now := time.Now() // the sockets' clock: one read per wake-up
		for _, ev := range p.events[:n] {
			fd := int(ev.Fd)
			if fd == p.wake {
				p.admit(now)
				continue
			}
			b := p.streams[fd]
			switch {
			case b == nil:
			case ev.Pad == clientTag:
				p.hungUp(b)
			default:
				p.pull(b, now)
			}
		}
		if now.Sub(p.lastScan) >= pumpScan {
			p.lastScan = now
			p.expire(now)
		}
		if p.yield {
			// What this round made runnable — the goroutines given their
			// streams back, the requests a first token let out of the
			// admission queue (exchange.tokenChunk) — waits on this P,
			// which the next raw wait would keep from it (another P
			// steals it only when idle): let it run now. Not every round:
			// a yield costs a wake-up of another thread.
			p.yield = false
			runtime.Gosched()
		}
	}
	return nil
}

// wait waits for the set's next events. With no stream in the loop it
// blocks as any system call does, the runtime free to give the loop's P
// to another thread. With streams it waits as a raw system call: the
// runtime is not told the thread blocks, so it neither hands the P over
// after 20 µs and takes it back when the call returns — a round of
// wake-ups per event — nor polls the thread every 20 µs meanwhile. The
// loop keeps its P while it waits, at most pumpScan; a stop-the-world or
// a preemption interrupts the wait with a signal (EINTR, as epoll_pwait
// is never restarted after a signal handler).
func (p *streamPump) wait() (int, error) {
	if len(p.streams) == 0 {
		return unix.EpollWait(p.ep, p.events, -1)
	}
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(p.ep), uintptr(unsafe.Pointer(&p.events[0])), uintptr(len(p.events)), uintptr(pumpScan/time.Millisecond), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// rawRead and rawWrite are read(2) and write(2) on non-blocking sockets,
// as raw system calls: they never wait, so the runtime need not be told
// (entersyscall), which would let it take the loop's P away while a write
// runs the loopback's receive path, and make the loop win it back.
func rawRead(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func rawWrite(fd int, b []byte) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// stop ends the loop: every stream goes back to its goroutine as it is.
func (p *streamPump) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running, p.looping = false, false
	for _, b := range p.incoming {
		p.handBack(b, pumpResult{}, exitStopped)
	}
	p.incoming, p.aborts = nil, nil
	for _, b := range p.streams {
		p.release(b, pumpResult{}, exitStopped)
	}
	unix.Close(p.ep)
	unix.Close(p.wake)
	p.ep, p.wake = -1, -1
}

// poke wakes the loop.
func (p *streamPump) poke() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		var one = [8]byte{1}
		unix.Write(p.wake, one[:]) //nolint:errcheck // a full counter wakes the loop as well
	}
}

// take hands b's stream to the loop and waits until the loop gives it
// back; false when the loop is not running (or b was closed meanwhile),
// and the caller relays the stream itself.
func (p *streamPump) take(b *detachedBody) (pumpResult, bool) {
	p.mu.Lock()
	if !p.running {
		p.mu.Unlock()
		return pumpResult{}, false
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		p.mu.Unlock()
		return pumpResult{}, false
	}
	b.inPump = true
	b.mu.Unlock()
	p.in.Inc() // one exit counted for each, in handBack
	p.incoming = append(p.incoming, b)
	p.mu.Unlock()
	p.poke()
	return <-b.back, true
}

// abort asks the loop to let b go: it was closed while in the loop.
func (p *streamPump) abort(b *detachedBody) {
	p.mu.Lock()
	p.aborts = append(p.aborts, b)
	p.mu.Unlock()
	p.poke()
}

// admit takes the streams handed over since the last wake-up into the
// set, then lets go of those closed from outside.
func (p *streamPump) admit(now time.Time) {
	var cnt [8]byte
	unix.Read(p.wake, cnt[:]) //nolint:errcheck // EAGAIN: woken for something else
	p.mu.Lock()
	in, ab := p.incoming, p.aborts
	p.incoming, p.aborts = p.spare[0][:0], p.spare[1][:0]
	p.mu.Unlock()
	for _, b := range in {
		b.pfd = b.fd // unchanged while the stream is in the loop: only handBack closes it
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(b.pfd)}
		if err := unix.EpollCtl(p.ep, unix.EPOLL_CTL_ADD, b.pfd, &ev); err != nil {
			p.handBack(b, pumpResult{}, exitStopped)
			continue
		}
		b.in = true
		p.streams[b.pfd] = b
		p.watchClient(b)
		if b.deadline.IsZero() {
			b.deadline = now.Add(b.limit())
		}
		if len(b.stash) > 0 { // the body bytes that came with the head
			raw := b.stash
			b.stash = nil
			p.deliver(b, raw, nil, now)
		}
	}
	for _, b := range ab {
		if b.in { // else handed back already, for another reason
			p.release(b, pumpResult{}, exitAborted)
		}
	}
	clear(in)
	clear(ab)
	p.spare[0], p.spare[1] = in[:0], ab[:0]
}

// clientTag marks the epoll events of a stream's client socket (the
// event's Fd is the stream's upstream descriptor either way).
const clientTag = 1

// watchClient has the loop tell when b's client hangs up, in place of the
// client watch's periodic checks (watch.go), which are paused meanwhile:
// per stream, a check a DisconnectCheck was a timer firing and a system
// call, for every waiting stream.
func (p *streamPump) watchClient(b *detachedBody) {
	cfd := -1
	if err := b.client.Control(func(fd uintptr) { cfd = int(fd) }); err != nil || cfd < 0 {
		return
	}
	ev := unix.EpollEvent{Events: unix.EPOLLRDHUP, Fd: int32(b.pfd), Pad: clientTag}
	if unix.EpollCtl(p.ep, unix.EPOLL_CTL_ADD, cfd, &ev) != nil {
		return // the watch goes on checking
	}
	b.cfd = cfd
	if w := b.r.watch; w != nil {
		w.pause()
	}
}

// hungUp ends b's stream as the client watch would have: its client has
// closed the connection.
func (p *streamPump) hungUp(b *detachedBody) {
	b.r.abort(fmt.Errorf("%w: connection closed by client", ErrClientGone))
	p.release(b, pumpResult{}, exitAborted)
}

// pull reads what b's upstream has, up to the relay's room for it (as
// relay.fill reads), and delivers it.
func (p *streamPump) pull(b *detachedBody, now time.Time) {
	r := b.r
	if r.buf == nil {
		r.takeBuf()
	}
	if len(r.in) == cap(r.in) && !p.grow(b) {
		return
	}
	n, err := rawRead(b.pfd, p.buf[:min(cap(r.in)-len(r.in), len(p.buf))])
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		if len(r.in) == 0 {
			r.putBuf()
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
		r.fail(errors.Join(ErrUpstream, errors.New("event larger than "+strconv.Itoa(maxEventBytes)+" bytes")))
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
	if r.x.firstTok.IsZero() { // the first token may let queued requests out
		defer func() { p.yield = p.yield || !r.x.firstTok.IsZero() }()
	}
	for len(raw) > 0 && readErr == nil && !b.dec.done() {
		if r.buf == nil {
			r.takeBuf()
		}
		if len(r.in) == cap(r.in) {
			r.process()
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
	r.process()
	if readErr != nil {
		// The events before the end go out now (the engine's last ones,
		// [DONE] among them), not when the goroutine next runs.
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
	if x.s.totalExceeded(x) {
		r.fail(errors.Join(ErrTimeout, errors.New("total request deadline")))
	} else if m := x.mig; m != nil && m.pol.DrainGrace > 0 && m.off == nil && !r.eof && m.leaving(x, x.s.now()) {
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
		r.putBuf() // nothing partial: the stream waits without buffers
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
	var n int
	var werr error
	if err := b.client.Write(func(fd uintptr) bool {
		n, werr = rawWrite(int(fd), f)
		return true // never wait: a socket that takes less goes back to the goroutine
	}); err != nil {
		werr = err
	}
	r.out, r.outPos = r.out[:0], 0
	n = max(n, 0)
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

// expire hands back the streams past their first-byte or idle timeout:
// the goroutine relay ends (or moves) them as a timed-out read.
func (p *streamPump) expire(now time.Time) {
	for _, b := range p.streams {
		if x := b.r.x; x.s.totalExceeded(x) { // the paused watch's other check
			b.r.abort(fmt.Errorf("%w: total request deadline %s", ErrTimeout, x.s.cfg.TotalTimeout))
			p.release(b, pumpResult{}, exitAborted)
			continue
		}
		if now.After(b.deadline) {
			p.release(b, pumpResult{readErr: os.ErrDeadlineExceeded}, exitTimeout)
		}
	}
}

// release takes b out of the set and hands it back.
func (p *streamPump) release(b *detachedBody, res pumpResult, why loopExit) {
	unix.EpollCtl(p.ep, unix.EPOLL_CTL_DEL, b.pfd, nil) //nolint:errcheck // it is closed below or wrapped later either way
	if b.cfd >= 0 {
		unix.EpollCtl(p.ep, unix.EPOLL_CTL_DEL, b.cfd, nil) //nolint:errcheck // the goroutine's again
		b.cfd = -1
	}
	delete(p.streams, b.pfd)
	b.in = false
	p.handBack(b, res, why)
}

// handBack gives b's stream back to its goroutine; a stream closed while
// in the loop has its socket closed now.
func (p *streamPump) handBack(b *detachedBody, res pumpResult, why loopExit) {
	p.out[why].Inc()
	b.mu.Lock()
	b.inPump = false
	if b.closed && b.fd >= 0 {
		unix.Close(b.fd)
		b.fd = -1
	}
	b.mu.Unlock()
	b.back <- res
	p.yield = true
}

// pumpResult is why the loop handed a stream back.
type pumpResult struct {
	readErr   error  // how the upstream read ended: io.EOF, a timeout, a reset, broken framing
	leaving   bool   // the replica is leaving its pool: the stream moves (migrate_resume.go)
	unsent    []byte // framed bytes the client's socket did not take
	clientErr error  // writing to the client failed: it is gone
}

// detachedBody is a stream's upstream after its head, taken from fasthttp
// (detach): its own socket, read by the loop, or — once handed back — by
// the goroutine relay through Read, as fasthttp's body stream would be.
type detachedBody struct {
	pump   *streamPump
	r      *relay
	dec    chunkDecoder
	stash  []byte          // body bytes read with the head, not yet decoded
	client syscall.RawConn // the client's socket, written by the loop
	back   chan pumpResult
	// reuse takes the connection back once the response has ended cleanly
	// (CloseWithError); nil when the engine said it closes it. extra: bytes
	// came after the response's end, so the connection is not reused.
	reuse *idleConns
	extra bool

	// The loop's, while the stream is in it.
	in              bool      // in the epoll set
	pfd             int       // fd as the set knows it
	cfd             int       // the client's socket, in the set for hang-ups; -1 if not
	deadline        time.Time // first byte or idle: the read must come by then
	firstByte, idle time.Duration

	mu     sync.Mutex
	fd     int      // the socket, until conn wraps it (-1 then, or once closed)
	conn   net.Conn // the socket wrapped for the goroutine relay's reads; nil until needed
	raw    []byte   // the goroutine relay's read buffer
	inPump bool
	closed bool
}

// limit is the read deadline's distance: first byte, then idle.
func (b *detachedBody) limit() time.Duration {
	if b.r.gotBody {
		return b.idle
	}
	return b.firstByte
}

// detach takes a stream's upstream from fasthttp when the loop can relay
// it: a chunked response whose head came alone on a plain socket
// (deadlineConn.limitHead), to a client on the router's own listener. It
// closes fasthttp's body stream, which closes fasthttp's connection (and
// so takes the socket out of Go's netpoller) while a duplicate descriptor
// keeps the socket open. nil when the stream stays fasthttp's.
func (p *streamPump) detach(x *exchange, resp *fasthttp.Response, client net.Conn) *detachedBody {
	c := x.upc
	x.upc = nil
	if c == nil || !c.headCut || resp.Header.ContentLength() != -1 {
		return nil
	}
	p.mu.Lock()
	running := p.running
	p.mu.Unlock()
	if !running {
		return nil
	}
	pc, ok := client.(*prefetchConn)
	if !ok {
		return nil
	}
	cs, ok := pc.Conn.(syscall.Conn)
	if !ok {
		return nil
	}
	craw, err := cs.SyscallConn()
	if err != nil {
		return nil
	}
	us, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil // TLS
	}
	uraw, err := us.SyscallConn()
	if err != nil {
		return nil
	}
	fd := -1
	if err := uraw.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || fd < 0 {
		return nil
	}
	b := &detachedBody{
		pump: p, stash: c.stash, client: craw, back: make(chan pumpResult, 1),
		firstByte: c.firstByte, idle: c.idle, fd: fd, cfd: -1,
	}
	if !resp.ConnectionClose() && x.up != nil {
		b.reuse = &x.up.idle
	}
	if c.awaiting && !c.armed.IsZero() {
		b.deadline = c.armed // the first-byte deadline already running
	}
	c.stash = nil
	resp.CloseBodyStream() //nolint:errcheck // closes fasthttp's descriptor; b keeps the socket
	return b
}

// Read is the goroutine relay's read of the stream: the chunked body's
// data, as fasthttp's body stream gives it.
func (b *detachedBody) Read(p []byte) (int, error) {
	for {
		if len(b.stash) > 0 {
			n, used, err := b.dec.decode(p, b.stash)
			b.stash = b.stash[used:]
			switch {
			case err != nil:
				return n, err
			case b.dec.done():
				return n, io.EOF
			case n > 0:
				return n, nil
			}
			continue // framing only
		}
		if b.dec.done() {
			return 0, io.EOF
		}
		c, err := b.netConn()
		if err != nil {
			return 0, err
		}
		n, err := c.Read(b.raw)
		b.stash = b.raw[:n]
		if n == 0 && err != nil {
			return 0, err
		}
	}
}

// netConn wraps the socket for Go's netpoller, once, with the same first-
// byte and idle deadlines fasthttp's reads had (deadlineConn).
func (b *detachedBody) netConn() (net.Conn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, net.ErrClosed
	}
	if b.conn == nil {
		f := os.NewFile(uintptr(b.fd), "upstream")
		fc, err := net.FileConn(f) // a descriptor of its own, non-blocking, in the netpoller
		f.Close()                  //nolint:errcheck // ours: fc has its own
		b.fd = -1
		if err != nil {
			b.closed = true
			return nil, err
		}
		gotBody := b.r != nil && b.r.gotBody
		b.conn = &deadlineConn{Conn: fc, firstByte: b.firstByte, idle: b.idle, awaiting: !gotBody, headEnd: 4}
		b.raw = make([]byte, relayBufSize)
	}
	return b.conn, nil
}

// CloseWithError closes the stream's socket, which aborts the engine's
// sequence if it still runs; in the loop, the loop closes it. A response
// read to its end (err nil) leaves its connection to the replica's next
// request instead, as fasthttp would.
func (b *detachedBody) CloseWithError(err error) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	if b.inPump {
		b.mu.Unlock()
		b.pump.abort(b)
		return nil
	}
	if err == nil && b.reuse != nil && b.dec.done() && len(b.stash) == 0 && !b.extra {
		c := b.conn
		if dc, ok := c.(*deadlineConn); ok {
			c = dc.Conn
		} else if c == nil {
			f := os.NewFile(uintptr(b.fd), "upstream")
			c, err = net.FileConn(f)
			f.Close() //nolint:errcheck // ours: c has its own
			b.fd = -1
		}
		b.mu.Unlock()
		if err == nil {
			b.reuse.put(c, time.Now())
		}
		return nil
	}
	if b.conn != nil {
		b.conn.Close() //nolint:errcheck
	} else if b.fd >= 0 {
		unix.Close(b.fd)
		b.fd = -1
	}
	b.mu.Unlock()
	return nil
}

// pumpStream relays r's stream in the loop while it can, when its upstream
// was detached; on return the goroutine relay goes on from where the loop
// stopped. An error means the client is gone.
func (r *relay) pumpStream(w io.Writer) error {
	b, ok := r.body.(*detachedBody)
	if !ok {
		return nil
	}
	b.r = r
	// The loop's writes never block; a write deadline left in force
	// would fail them once it passed. The goroutine arms its own again.
	r.disarmWrite()
	res, ok := b.pump.take(b)
	if !ok {
		return nil
	}
	if r.watch != nil {
		r.watch.resume() // the loop watched the client meanwhile
	}
	if len(res.unsent) > 0 {
		if err := r.armWrite(); err != nil {
			return err
		}
		if _, err := w.Write(res.unsent); err != nil {
			return err
		}
	}
	switch {
	case res.clientErr != nil:
		return res.clientErr
	case res.leaving:
		r.upstreamFailed(errLeaving)
	case res.readErr != nil:
		return r.afterRead(res.readErr)
	}
	return nil
}
