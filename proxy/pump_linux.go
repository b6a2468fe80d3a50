//go:build linux

package proxy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/internal/netloop"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// The stream loop. A stream spends its life waiting for the engine's next
// event, then moving it to the client: on a goroutine of its own, every
// event costs the Go scheduler a park and a wake, a read that finds
// nothing, fasthttp's buffered chunk parsing and a deadline's clock read —
// half again the CPU a proxy doing its own I/O spends per event (`gpurouter
// bench proxy-cost`, the epoll-bare column). So once a stream's head is
// out, its upstream socket leaves fasthttp and Go's netpoller for an
// epoll set that a single goroutine waits on (one per loop: Server.pumps,
// Config.StreamLoops): each wake-up reads every
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
	clock func() time.Time // the exchanges' clock (Options.Now); nil: the sockets' own, time.Now
	in    prometheus.Counter
	out   [loopExits]prometheus.Counter // by loopExit

	size atomic.Int64 // streams in the loop now: taken and not yet handed back (gpurouter_stream_loop_streams)

	mu       sync.Mutex
	running  bool            // open: streams may be handed over
	looping  bool            // Run's goroutine runs the loop
	ep, wake int             // the epoll set and the eventfd that wakes it (valid while running)
	incoming []*detachedBody // handed over (take), not yet in the set
	aborts   []*detachedBody // closed from outside while in the loop
	spare    [2][]*detachedBody

	// The loop's own, touched by Run's goroutine only.
	streams  netloop.FDTable[detachedBody] // by upstream descriptor
	bufs     bufStack                      // the streams' relay buffers while they wait
	buf      []byte                        // every read lands here, and is decoded before the next
	frame    []byte                        // a chunk being written to a client
	events   []unix.EpollEvent
	lastScan time.Time
	at       time.Time   // the exchanges' clock at this wake-up: every event's timings
	yield    bool        // this round made goroutines runnable
	loops    int         // the server's loops that keep a P while they relay streams: its stream loops, this one included, and its request loops
	holdP    bool        // wait as a raw system call (wait)
	batch    streamBatch // a wake-up's reads and writes, each in one system call (pump_batch_linux.go)
	// unbatched: no batch (Config.UnbatchedIO); batchOff hears why a
	// loop's batch could not open.
	unbatched bool
	batchOff  func(error)
	// batchedReads and batchedWrites count the reads and writes made in
	// batches (gpurouter_loop_batched_io_total).
	batchedReads, batchedWrites prometheus.Counter

	// hosted: a request loop's (reqloop_stream_linux.go), which relays
	// its streams in its own set with these methods (host, pull, expire,
	// release): Run never runs, and the sockets' registrations are the
	// request loop's.
	hosted bool
}

// registerLoopGauges publishes each loop's streams in flight, so a loop
// that holds more than its share shows: the stream loops' (loop "0", "1",
// …) and the request loops' own (loop "request-0", …).
func registerLoopGauges(reg prometheus.Registerer, pumps []*streamPump, reqLoops []*requestLoop) error {
	gauge := func(loop string, p *streamPump) error {
		return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "gpurouter_stream_loop_streams",
			Help:        "Streams relayed in a loop now, by loop (Linux): a stream loop's (upstream.stream_loops; streams served on fasthttp's path), or a request loop's (request-N; upstream.request_loops, the streams whose requests it served).",
			ConstLabels: prometheus.Labels{"loop": loop},
		}, func() float64 { return float64(p.size.Load()) }))
	}
	for i, p := range pumps {
		if err := gauge(strconv.Itoa(i), p); err != nil {
			return err
		}
	}
	for i, l := range reqLoops {
		if err := gauge("request-"+strconv.Itoa(i), l.host); err != nil {
			return err
		}
	}
	return nil
}

// pumpScan is how often the loop looks for streams past their first-byte
// or idle timeout: each fires at most this late.
const pumpScan = 100 * time.Millisecond

// newStreamPump is a stream loop of a server with cfg and metrics m;
// clock is the exchanges' (Options.Now), nil for time.Now; batchOff hears
// why the loop's reads and writes are not batched (openBatch), nil: no one.
func newStreamPump(cfg Config, m *metrics, clock func() time.Time, batchOff func(error)) *streamPump {
	p := &streamPump{ep: -1, wake: -1, in: m.loopIn, loops: cfg.StreamLoops, clock: clock,
		unbatched: cfg.UnbatchedIO, batchOff: batchOff, batchedReads: m.streamReads, batchedWrites: m.streamWrites}
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
	ep, wake, err := netloop.OpenEpollWake()
	if err != nil {
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
	p.streams = netloop.FDTable[detachedBody]{}
	p.buf = make([]byte, 64<<10)
	p.events = make([]unix.EpollEvent, 256)
	p.openBatch()
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
		p.at = now
		if p.clock != nil {
			p.at = p.clock()
		}
		p.dispatch(p.events[:n], now)
		if now.Sub(p.lastScan) >= pumpScan {
			p.lastScan = now
			p.expire(now)
			p.holdP = runtime.GOMAXPROCS(0) > p.loops // GOMAXPROCS may change (container limits)
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

// dispatch acts on one wake-up's events: the streams' reads in a batch
// (queuePull), made before anything else is acted on, and at the end.
func (p *streamPump) dispatch(events []unix.EpollEvent, now time.Time) {
	for _, ev := range events {
		fd := int(ev.Fd)
		if fd == p.wake {
			p.flushPulls(now)
			p.admit(now)
			continue
		}
		b := p.streams.Get(fd)
		switch {
		case b == nil:
		case ev.Pad == clientTag:
			// The batch first: it may have let b go, its client's
			// hang-up then nothing to act on, as in the order the wait
			// gave them.
			p.flushPulls(now)
			if b = p.streams.Get(fd); b != nil {
				p.hungUp(b)
			}
		default:
			p.queuePull(b, now)
		}
	}
	p.flushPulls(now)
}

// wait waits for the set's next events. With no stream in the loop it
// blocks as any system call does, the runtime free to give the loop's P
// to another thread. With streams it waits as a raw system call: the
// runtime is not told the thread blocks, so it neither hands the P over
// after 20 µs and takes it back when the call returns — a round of
// wake-ups per event — nor polls the thread every 20 µs meanwhile. The
// loop keeps its P while it waits, at most pumpScan; a stop-the-world or
// a preemption interrupts the wait with a signal (EINTR, as epoll_pwait
// is never restarted after a signal handler). Unless the loops would
// hold every P (GOMAXPROCS no more than the loops: a one-core router):
// then nothing else would run but when the runtime preempts a loop, every
// 10–20 ms, so the loop waits as any system call does, and pays the
// wake-ups.
func (p *streamPump) wait() (int, error) {
	if p.streams.N == 0 {
		return unix.EpollWait(p.ep, p.events, -1)
	}
	if !p.holdP {
		return unix.EpollWait(p.ep, p.events, int(pumpScan/time.Millisecond))
	}
	return netloop.RawEpollWait(p.ep, p.events, int(pumpScan/time.Millisecond))
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
	for _, b := range p.streams.By {
		if b != nil {
			p.release(b, pumpResult{}, exitStopped)
		}
	}
	unix.Close(p.ep)
	unix.Close(p.wake)
	p.ep, p.wake = -1, -1
	p.closeBatch()
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
	p.size.Add(1)
	p.incoming = append(p.incoming, b)
	p.mu.Unlock()
	p.poke()
	return <-b.back, true
}

// abort asks the loop to let b go: it was closed while in the loop.
func (p *streamPump) abort(b *detachedBody) {
	if p.hosted {
		return // closed by the loop itself, which releases it next (hungUp, expire)
	}
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
		p.streams.Set(b.pfd, b)
		p.watchClient(b)
		p.begin(b, now)
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

// expire hands back the streams past their first-byte or idle timeout:
// the goroutine relay ends (or moves) them as a timed-out read. It also
// ends those past the total deadline, one of the paused client watch's
// checks (watchClient sees the hang-ups); the watch's third, the drain
// deadline, needs no twin: Shutdown sets it after Serve has returned, by
// when the loop has handed every stream back and their watches run again.
func (p *streamPump) expire(now time.Time) {
	for _, b := range p.streams.By {
		if b == nil {
			continue
		}
		x := b.r.x
		if err := x.s.to.totalPassed(x.received, x.s.now()); err != nil { // the paused watch's other check
			b.r.abort(err)
			p.release(b, pumpResult{}, exitAborted)
			continue
		}
		if now.After(b.deadline) {
			p.release(b, pumpResult{readErr: os.ErrDeadlineExceeded}, exitTimeout)
		}
	}
}

// host takes b's stream into a hosted loop (hosted): its sockets are in
// the request loop's set already, which passes their events on.
func (p *streamPump) host(b *detachedBody, now time.Time) {
	p.in.Inc()
	p.size.Add(1)
	b.mu.Lock()
	b.inPump = true
	b.mu.Unlock()
	b.pfd, b.cfd, b.in = b.fd, b.clientFD, true
	p.streams.Set(b.pfd, b)
	p.begin(b, now)
}

// begin starts b's relay in the loop: its read deadline, unless one runs
// already, and the body bytes that came with the head.
func (p *streamPump) begin(b *detachedBody, now time.Time) {
	if b.deadline.IsZero() {
		b.deadline = now.Add(b.limit())
	}
	if len(b.stash) > 0 {
		raw := b.stash
		b.stash = nil
		p.deliver(b, raw, nil, now)
	}
}

// release takes b out of the set and hands it back.
func (p *streamPump) release(b *detachedBody, res pumpResult, why loopExit) {
	if !p.hosted {
		unix.EpollCtl(p.ep, unix.EPOLL_CTL_DEL, b.pfd, nil) //nolint:errcheck // it is closed below or wrapped later either way
		if b.cfd >= 0 {
			unix.EpollCtl(p.ep, unix.EPOLL_CTL_DEL, b.cfd, nil) //nolint:errcheck // the goroutine's again
		}
	}
	b.cfd = -1
	p.streams.Del(b.pfd)
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
		b.cap.give()
	}
	b.mu.Unlock()
	p.size.Add(-1)
	if b.onBack != nil {
		b.onBack(res) // it must not wait, nor take p.mu (stop holds it)
		return
	}
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
