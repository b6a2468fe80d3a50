//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/internal/netloop"
	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// The request loop (docs/dataplane-loop.md, increment 2; Config.RequestLoops).
// On fasthttp's path a whole request costs the Go scheduler two parks and
// two wakes (the client's request, the engine's answer), reads that find
// nothing, and fasthttp's buffered I/O on both sides: at c=64 the router
// spends about twice HAProxy's CPU a request, most of it there. The loop
// serves the steady case the way HAProxy does instead: client and engine
// sockets in one epoll set, each read once per readiness, each answer
// written at once.
//
// The loop only ever does the I/O, as the stream loop does
// (pump_linux.go): every decision is the request's flow's (flow.go), which
// the loop drives as proxyAPI does on fasthttp's goroutine — nothing is
// decided twice, or differently (reqloop_exchange_linux.go: act). Streams
// are served here too, their events relayed by the loop
// (reqloop_stream_linux.go). What it does not serve it hands off, by its
// head, before anything is done — the connection, with the bytes read so
// far, goes to fasthttp's server (handOff): the router's own endpoints,
// HTTP/1.0, chunked request bodies, Expect, bodies or heads over the
// limits, and, where a pool is behind TLS (which the loop does not speak),
// splits its long prompts or tokenizes them for its prefix index
// (table.go: goroutineOnly), the requests its path does not route to
// another pool. What would block
// goes to a goroutine that posts its result back (post): an admission
// wait, a new engine connection, a retry's pause.

// haveRequestLoops tells New that request loops run here.
const haveRequestLoops = true

// requestLoop is one request loop. Its zero value is not usable:
// newRequestLoop.
type requestLoop struct {
	s    *Server
	size atomic.Int64 // client connections in the loop

	mu      sync.Mutex
	running bool
	ep      int         // the epoll set (valid while running)
	wake    int         // the eventfd that wakes it (valid while running)
	posted  []func()    // work goroutines handed back: admissions, dials
	spare   []func()    // posted's previous backing array
	queued  []*loopConn // accepted connections not yet in the set
	spareQ  []*loopConn

	// Run's own.
	host     *streamPump // relays the loop's streams (reqloop_stream_linux.go)
	reads    loopReads   // a wake-up's reads of clients and engines (reqloop_batch_linux.go)
	conns    netloop.FDTable[loopConn]
	events   []unix.EpollEvent
	buf      []byte // every read lands here first
	rd       bytes.Reader
	br       *bufio.Reader // reads request and response heads from memory for fasthttp's parsers
	bw       *bufio.Writer // writes responses to their client's socket (w)
	w        loopWriter
	idle     map[*upstream][]*loopConn // keep-alive engine connections by replica, most recent last
	ctxs     []*fasthttp.RequestCtx    // spare contexts
	now      time.Time                 // this wake-up's clock (time.Now)
	lastScan time.Time
	// quiet: the last scan found nothing in progress, and nothing came
	// since; the loop then sleeps until quietUntil (zero: until woken),
	// the first idle connection's expiry, not a scan's period.
	quiet      bool
	quietUntil time.Time
	holdP      bool // wait as a raw system call while relaying streams (wait)
	// An answer relayed from its bytes (rawAnswer): the client's head and
	// body, and the Date field's value for the second dateSec.
	ans      []byte
	dateText []byte
	dateSec  int64
}

// newRequestLoop is a loop of s's; clock is the exchanges' (Options.Now),
// nil for time.Now.
func newRequestLoop(s *Server, clock func() time.Time) *requestLoop {
	host := newStreamPump(s.cfg, s.m, clock, s.batchOff)
	host.hosted = true
	return &requestLoop{s: s, ep: -1, wake: -1, host: host}
}

// open readies the loop to take connections before Run's goroutine first
// runs. Opening an open loop does nothing.
func (l *requestLoop) open() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running {
		return nil
	}
	ep, wake, err := netloop.OpenEpollWake()
	if err != nil {
		return err
	}
	l.running, l.ep, l.wake = true, ep, wake
	return nil
}

// take gives the loop a client connection accepted by the listener; false
// when the loop does not run (the connection stays the caller's). On
// success c is closed: the loop keeps the socket through a duplicate
// descriptor, out of Go's netpoller.
func (l *requestLoop) take(c net.Conn) bool {
	fd, ok := netloop.Dup(c)
	if !ok {
		return false
	}
	lc := &loopConn{fd: fd, addrs: loopAddrs{c.LocalAddr(), c.RemoteAddr()}}
	l.mu.Lock()
	if !l.running {
		l.mu.Unlock()
		unix.Close(fd)
		return false
	}
	l.queued = append(l.queued, lc)
	l.mu.Unlock()
	l.size.Add(1)
	c.Close() //nolint:errcheck // the duplicate keeps the socket open
	l.poke()
	return true
}

// post runs f on the loop's goroutine at its next wake-up: how goroutines
// that waited for the loop (an admission, a dial) hand their result back.
// false when the loop has stopped: f never runs.
func (l *requestLoop) post(f func()) bool {
	l.mu.Lock()
	running := l.running
	if running {
		l.posted = append(l.posted, f)
	}
	l.mu.Unlock()
	if running {
		l.poke()
	}
	return running
}

func (l *requestLoop) poke() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.wake >= 0 {
		var one = [8]byte{1}
		unix.Write(l.wake, one[:]) //nolint:errcheck // a full counter wakes the loop too
	}
}

// reqLoopScan is how often the loop looks for requests past a deadline
// and connections idle too long: each fires at most this late.
const reqLoopScan = 100 * time.Millisecond

// Run runs the loop until ctx ends, then closes every connection in it:
// requests in progress end with ErrShuttingDown.
//
// Its goroutine is not locked to its thread. A busy loop runs without
// ever rescheduling (its waits are short, or raw: wait), so the runtime's
// monitor preempts it every 10–20 ms; a locked goroutine's preemption
// parks its thread and hands the P to another one and back, about three
// futex calls more each time. Unlocked, it is only requeued: half the
// futex calls at c=1 and under 64 streams (412–500 against 765–1,062 a
// run in four interleaved pairs).
func (l *requestLoop) Run(ctx context.Context) error {
	if err := l.open(); err != nil {
		return err
	}
	l.events = make([]unix.EpollEvent, 256)
	l.buf = make([]byte, 64<<10)
	l.br = bufio.NewReaderSize(&l.rd, max(l.s.cfg.MaxHeaderBytes, l.s.cfg.MaxUpstreamHeader, 4096))
	l.bw = bufio.NewWriterSize(nil, 4096)
	l.w.l = l
	l.host.buf = l.buf
	l.host.openBatch()
	l.openReads()
	l.holdP = runtime.GOMAXPROCS(0) > len(l.s.reqLoops)
	l.idle = map[*upstream][]*loopConn{}
	defer l.stop()
	stopWatch := context.AfterFunc(ctx, l.poke)
	defer stopWatch()
	for ctx.Err() == nil {
		n, err := l.wait()
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		l.now = time.Now()
		if n > 0 {
			l.quiet = false
		}
		l.host.at = l.now // its streams' events' timings, on the exchanges' clock
		if l.host.clock != nil {
			l.host.at = l.host.clock()
		}
		for _, ev := range l.events[:max(n, 0)] {
			fd := int(ev.Fd)
			if c := l.conns.Get(fd); c != nil && ev.Events&unix.EPOLLOUT == 0 {
				// A socket to read: its read joins the wake-up's batch,
				// made before anything else is touched — a stream's
				// engine's in the streams' (reqloop_stream_linux.go).
				if c.stream != nil {
					l.host.queuePull(c.stream, l.now)
				} else {
					l.queueRead(c)
				}
				continue
			}
			// The batch first, and the connection looked up after it:
			// what a read gave may have let connections go.
			l.flushReads()
			if fd == l.wake {
				l.admit()
				continue
			}
			c := l.conns.Get(fd)
			if c == nil {
				continue
			}
			if ev.Events&unix.EPOLLOUT != 0 && !l.writable(c) {
				continue
			}
			if ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
				if c.up != nil {
					l.readUpstream(c)
				} else {
					l.readClient(c)
				}
			}
		}
		l.flushReads()
		if l.now.Sub(l.lastScan) >= reqLoopScan {
			l.lastScan = l.now
			l.scan()
			l.holdP = runtime.GOMAXPROCS(0) > len(l.s.reqLoops) // GOMAXPROCS may change (container limits)
		}
		if l.host.yield {
			// A stream's first token may have let requests out of the
			// admission queue, goroutines runnable on this P (as in
			// streamPump.Run).
			l.host.yield = false
			runtime.Gosched()
		}
	}
	return nil
}

// waitMillis is how long the next wait may block: until the next scan.
// A quiet loop (only idle connections, or none) sleeps until the first of
// them expires, or until woken (-1): every wake-up of a loop's thread
// costs more than its own work, since the runtime takes the thread's P
// when it blocks again, and that sets its monitor (sysmon) polling every
// 20 µs for a millisecond and more. With 64 streams in the stream loop
// and this loop waking ten times a second for nothing, sysmon woke 680
// times a second, ~3% of the router's CPU; 175 once this loop slept.
func (l *requestLoop) waitMillis() int {
	if !l.quiet {
		return int(reqLoopScan / time.Millisecond)
	}
	if l.quietUntil.IsZero() {
		return -1
	}
	return max(int(max(reqLoopScan, l.quietUntil.Sub(l.now)+time.Millisecond)/time.Millisecond), 1)
}

// wait waits for the set's next events (waitMillis). While the loop is
// busy (not quiet) or relays streams it waits as a raw system call,
// keeping its P, as a stream loop does and for the same reason
// (streamPump.wait): told the thread blocks, the runtime hands the P over
// after 20 µs when other work wants it and takes it back when the wait
// returns, a round of thread wake-ups per event — measured on the
// harness's 64 streams, a sixth more CPU an event. And a wait entered
// that way wakes the runtime's monitor (sysmon) when it sleeps, which
// then polls every 20 µs for a millisecond and more: at c=1, where every
// request waits once for its engine, 1,600 wake-ups a second (4,758 in
// 3 s; 297 waiting raw), and a median 8% more CPU per request (10
// interleaved pairs, every one lower raw; 2026-11-27). A quiet loop
// waits as any system call does: it may sleep for minutes, and its P
// serves the rest of the router meanwhile. Unless the request loops
// would hold every P (holdP): a one-core router.
func (l *requestLoop) wait() (int, error) {
	if !l.holdP || (l.quiet && l.host.streams.N == 0) {
		return unix.EpollWait(l.ep, l.events, l.waitMillis())
	}
	return netloop.RawEpollWait(l.ep, l.events, l.waitMillis())
}

// admit takes the connections queued and the results posted since the
// last wake-up.
func (l *requestLoop) admit() {
	var cnt [8]byte
	unix.Read(l.wake, cnt[:]) //nolint:errcheck
	l.mu.Lock()
	queued, posted := l.queued, l.posted
	l.queued, l.posted = l.spareQ[:0], l.spare[:0]
	l.mu.Unlock()
	for _, c := range queued {
		c.since = l.now
		if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, c.fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(c.fd)}); err != nil {
			l.closeClient(c)
			continue
		}
		l.conns.Set(c.fd, c)
	}
	for i, f := range posted {
		f()
		posted[i] = nil
	}
	clear(queued)
	l.spareQ, l.spare = queued[:0], posted[:0]
}

// scan ends what ran past a deadline, and closes connections idle too
// long or, once the router drains, idle at all.
func (l *requestLoop) scan() {
	draining, aborting := l.s.draining.Load(), l.s.abortStreams.Load()
	quiet, until := true, time.Time{}
	expires := func(t time.Time) {
		if until.IsZero() || t.Before(until) {
			until = t
		}
	}
	for _, c := range l.conns.By {
		switch {
		case c == nil:
		case c.up != nil:
			if c.peer != nil || c.stream != nil {
				continue // its client's request is scanned; a stream's relay is (below)
			}
			if l.scanUpstream(c) {
				expires(c.since.Add(l.s.to.engineKeepAlive))
			}
		case len(c.out) > 0:
			quiet = false
			if aborting || l.now.Sub(c.wrote) > l.s.to.idle {
				// A client that stops reading holds no answer for good:
				// a write must progress within the idle timeout, as on
				// fasthttp's path (Server.WriteTimeout).
				l.clientGone(c)
			}
		case c.r != nil:
			quiet = false
			l.scanRequest(c, aborting)
		case c.in != nil && c.in.Len() > 0 && !aborting:
			quiet = false
			if l.now.Sub(c.since) > l.s.to.read {
				l.requestTimeout(c)
			}
		case draining || l.now.Sub(c.since) > l.s.to.keepAlive:
			l.closeClient(c)
		default:
			expires(c.since.Add(l.s.to.keepAlive))
		}
	}
	if l.host.streams.N > 0 {
		quiet = false
		l.scanStreams(aborting)
	}
	l.quiet, l.quietUntil = quiet, until
}

// stop ends the loop: requests in progress end, connections close.
func (l *requestLoop) stop() {
	l.mu.Lock()
	l.running = false // from now on a goroutine's post fails, and it ends its own work
	queued, posted := l.queued, l.posted
	l.queued, l.posted = nil, nil
	l.mu.Unlock()
	for _, c := range queued {
		l.closeClient(c)
	}
	// What was posted before: an admission's end (the exchange is the
	// loop's again) or a dial's connection, each taken as usual, and
	// closed or aborted below with the rest.
	for _, f := range posted {
		f()
	}
	l.stopStreams()
	for _, c := range l.conns.By {
		switch {
		case c == nil:
		case c.up != nil:
			l.closeUpstream(c)
		default:
			if c.r != nil {
				l.abort(c, errLoopStopped)
			}
			l.closeClient(c)
		}
	}
	l.mu.Lock()
	unix.Close(l.ep)
	unix.Close(l.wake)
	l.ep, l.wake = -1, -1
	l.mu.Unlock()
	l.host.closeBatch()
}

var errLoopStopped = errors.Join(ErrShuttingDown, errors.New("request loop stopped"))
