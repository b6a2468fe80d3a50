package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/fasthttp"
)

// errBrokenStream marks an upstream stream that ended, or failed, before
// its data: [DONE]; the client is told with an error event.
var errBrokenStream = fmt.Errorf("%w: stream ended without [DONE]", ErrUpstream)

// maxEventBytes bounds one SSE event; an upstream sending more without a
// blank line is broken, not a reason to grow memory without bound.
const maxEventBytes = 4 << 20

const doneEvent = "data: [DONE]\n\n"

// relay streams an upstream SSE response to the client event by event. It
// is the body stream fasthttp reads from after the handler returns: every
// Read hands over the complete events that have arrived, so each is
// flushed as soon as it lands. It records token timings on the exchange,
// removes the usage chunk the router injected, turns an upstream failure
// into an error event plus [DONE], and on close releases everything the
// request held (see CloseWithError).
type relay struct {
	x     *exchange
	body  fasthttp.ReadCloserWithError // the upstream response stream
	resp  *fasthttp.Response
	strip bool // drop the usage-only chunk: the client did not ask for it

	buf     []byte // backing store of in; nil while the stream waits with nothing partial (fill)
	one     [1]byte
	bufp    *[]byte // relayBufs' holders of buf and out, kept so returning them allocates nothing
	outp    *[]byte
	in      []byte // upstream bytes not yet split into events
	out     []byte // processed bytes the client has not read yet
	outPos  int
	sawDone bool
	hints   openai.ChunkHints // where the stream's chunks have their choices and output (sse.go)
	eof     bool              // nothing more will be written after out
	failure error             // why the stream ended badly (nil for a clean end)
	errEv   bool              // the upstream sent an error event
	gotBody bool              // a byte of the body has arrived (the idle timeout now applies, not first_byte)

	abortErr  atomic.Pointer[error] // set by abort, from the watcher
	watch     *clientWatch
	closeOnce sync.Once

	// conn is the client connection WriteTo's writes go to, nil if unknown:
	// each write must complete within the idle timeout (armWrite), or the
	// client is gone. wdl is the write deadline in force.
	conn net.Conn
	wdl  time.Time
}

// relayBufs hold a stream's unsplit upstream bytes (in) and its processed
// ones (out). They start small — most events are a few hundred bytes —
// and grow on demand; a stream holds them only from an event's first byte
// until it is written (fill), not while it waits for the next.
var relayBufs = sync.Pool{New: func() any { b := make([]byte, 0, relayBufSize); return &b }}

const relayBufSize = 1 << 10

// maxKeptRelayBuf is the largest relay buffer returned to relayBufs: a
// grown one is not kept for streams that need little, and a stream whose
// events needed more keeps its own.
const maxKeptRelayBuf = 8 * relayBufSize

// newRelay relays body, resp's stream (fasthttp's, or taken from it:
// pump_linux.go).
func newRelay(x *exchange, resp *fasthttp.Response, body fasthttp.ReadCloserWithError, strip bool) *relay {
	return &relay{
		x:     x,
		body:  body,
		resp:  resp,
		strip: strip,
	}
}

// takeBuf gives the relay its buffers from relayBufs where it has none:
// buf (in's backing store) and out.
func (r *relay) takeBuf() { r.takeBufFrom(nil) }

// takeBufFrom is takeBuf with s, a stream loop's own spare buffers, tried
// before relayBufs.
func (r *relay) takeBufFrom(s *bufStack) {
	if r.buf == nil {
		r.bufp = s.get()
		r.buf = (*r.bufp)[:0]
	}
	r.in = r.buf[:0]
	if r.out == nil {
		r.outp = s.get()
		r.out = (*r.outp)[:0]
	}
}

// putBuf returns the relay's buffers to relayBufs; out must have been
// written. One that grew past maxKeptRelayBuf stays with the stream: its
// events need it.
func (r *relay) putBuf() { r.putBufTo(nil) }

// putBufTo is putBuf with s, a stream loop's own spare buffers, filled
// before relayBufs.
func (r *relay) putBufTo(s *bufStack) {
	if putRelayBuf(&r.bufp, r.buf, s) {
		r.buf, r.in = nil, nil
	}
	if putRelayBuf(&r.outp, r.out, s) {
		r.out = nil
	}
}

// bufStack is a stream loop's spare relay buffers, touched by the loop's
// goroutine alone: a stream in the loop gives its buffers back after
// every event (it waits without them) and takes them again at the next,
// two gets and two puts an event that sync.Pool pays for in pinning and
// per-P queues, and a plain stack does not. A nil *bufStack is empty and
// full: relayBufs serves.
type bufStack []*[]byte

// maxLoopBufs bounds a loop's spare buffers (1 KiB each unless grown, at
// most maxKeptRelayBuf): past it they go to relayBufs.
const maxLoopBufs = 64

func (s *bufStack) get() *[]byte {
	if s != nil && len(*s) > 0 {
		i := len(*s) - 1
		b := (*s)[i]
		(*s)[i] = nil
		*s = (*s)[:i]
		return b
	}
	return relayBufs.Get().(*[]byte)
}

func (s *bufStack) put(b *[]byte) {
	if s != nil && len(*s) < maxLoopBufs {
		*s = append(*s, b)
		return
	}
	relayBufs.Put(b)
}

// putRelayBuf puts b into s (relayBufs when s is nil or full) through *p
// (made when b did not come from a pool), unless b is nil or too large;
// it reports whether it did.
func putRelayBuf(p **[]byte, b []byte, s *bufStack) bool {
	if b == nil || cap(b) > maxKeptRelayBuf {
		return false
	}
	if *p == nil {
		*p = new([]byte)
	}
	**p = b[:0]
	s.put(*p)
	*p = nil
	return true
}

// abort ends the stream from outside (client gone, shutdown, deadline): it
// interrupts a blocked upstream read by closing the upstream connection,
// which is also what tells the engine to stop generating.
func (r *relay) abort(err error) {
	if !r.abortErr.CompareAndSwap(nil, &err) {
		return
	}
	if m := r.x.mig; m != nil {
		// A migration may be swapping the body (migrate_resume.go).
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.bodyClosed {
			return
		}
		m.bodyClosed = true
	}
	r.body.CloseWithError(err)
}

// WriteTo hands fasthttp's chunked body writer the processed events
// directly, each read's worth as one chunk: no copy into fasthttp's own
// 4 KiB copy buffer, which a waiting stream would otherwise hold too. An
// error ends the stream (the client is gone); fasthttp then calls
// CloseWithError with it. A stream on its hijacked connection runs the
// same loop through chunkWriter (hijack.go).
func (r *relay) WriteTo(w io.Writer) (int64, error) {
	var total int64
	defer r.disarmWrite()
	for {
		if r.outPos < len(r.out) {
			if err := r.armWrite(); err != nil {
				return total, err
			}
			n, err := w.Write(r.out[r.outPos:])
			total += int64(n)
			r.outPos += n
			if err != nil {
				return total, err
			}
		}
		r.out, r.outPos = r.out[:0], 0
		if r.eof {
			return total, nil
		}
		if err := r.fill(); err != nil {
			return total, err
		}
	}
}

// armWrite keeps a write deadline of about the idle timeout ahead of the
// stream's next write to the client. A client that stops reading (a stuck
// consumer, a peer that vanished without a FIN) would otherwise block that
// write for good once the socket buffers fill, and with it the engine's
// sequence, the replica's lease and the upstream connection; its write
// fails instead, and the stream ends as the client's (ErrClientGone). The
// deadline moves once per sixteenth of the timeout, not on every write.
func (r *relay) armWrite() error {
	limit := r.x.s.to.idle
	if r.conn == nil || limit <= 0 {
		return nil
	}
	now := time.Now() // the socket's clock, not the router's (which tests inject)
	if r.wdl.Sub(now) > limit-limit/16 {
		return nil
	}
	r.wdl = now.Add(limit)
	return r.conn.SetWriteDeadline(r.wdl)
}

// disarmWrite lifts the stream's write deadline: the connection may serve
// the client's next request, whose writes are fasthttp's.
func (r *relay) disarmWrite() {
	if !r.wdl.IsZero() {
		r.conn.SetWriteDeadline(time.Time{}) //nolint:errcheck // a closed connection has none to lift
		r.wdl = time.Time{}
	}
}

// SupportsBodyWriteTo tells fasthttp to use WriteTo (fasthttp.BodyWriterTo).
func (r *relay) SupportsBodyWriteTo() bool { return true }

// Read implements io.Reader, for readers other than fasthttp's chunked
// body writer.
func (r *relay) Read(p []byte) (int, error) {
	for {
		if r.outPos < len(r.out) {
			n := copy(p, r.out[r.outPos:])
			r.outPos += n
			return n, nil
		}
		r.out, r.outPos = r.out[:0], 0
		if r.eof {
			return 0, io.EOF
		}
		if err := r.fill(); err != nil {
			return 0, err
		}
	}
}

// fill reads once from upstream and processes every complete event. It
// returns an error only when the client is gone (nothing left to tell it).
func (r *relay) fill() error {
	var n int
	var err error
	if len(r.in) == 0 {
		// Nothing partial is held, which is how a stream waits for its next
		// event (most of its life): wait for the event's first byte without
		// a buffer, then take one for the rest — the same read(2), already
		// in the upstream connection's read buffer.
		r.putBuf()
		if n, err = r.body.Read(r.one[:]); n > 0 {
			r.takeBuf()
			r.in = append(r.in, r.one[0])
			if err == nil {
				var m int
				m, err = r.body.Read(r.in[1:cap(r.in)])
				r.in = r.in[:1+m]
				n += m
			}
		}
	} else {
		if len(r.in) == cap(r.in) {
			if len(r.in) >= maxEventBytes {
				r.fail(fmt.Errorf("%w: event larger than %d bytes", ErrUpstream, maxEventBytes))
				return nil
			}
			grown := make([]byte, len(r.in), 2*cap(r.in)+relayBufSize)
			copy(grown, r.in)
			r.buf, r.in = grown, grown
		}
		n, err = r.body.Read(r.in[len(r.in):cap(r.in)])
		r.in = r.in[:len(r.in)+n]
	}
	if n > 0 {
		r.gotBody = true
		r.process(r.x.s.now())
	}
	return r.afterRead(err)
}

// afterRead ends or moves the stream as the outcome of a read of its
// upstream says (err: the read's error, nil after one that delivered):
// the total deadline, a replica leaving its pool, an abort, the stream's
// end or failure. Like fill, it returns an error only when the client is
// gone.
func (r *relay) afterRead(err error) error {
	if err == nil {
		if r.afterEvents(r.x.s.now()) {
			r.upstreamFailed(errLeaving)
		}
		return nil
	}
	if ap := r.abortErr.Load(); ap != nil {
		return r.aborted(*ap)
	}
	switch {
	case errors.Is(err, io.EOF) && r.sawDone:
		r.eof = true
	case errors.Is(err, io.EOF):
		r.upstreamFailed(errBrokenStream)
	case isTimeout(err) && !r.gotBody:
		// The engine answered the head but not yet the first event (a
		// stream queued or in prefill): upstream.go's first_byte bound.
		r.fail(r.x.s.to.noFirstEvent())
	case isTimeout(err):
		r.upstreamFailed(r.x.s.to.noEvent())
	default:
		r.upstreamFailed(&upstreamFailure{kind: errBrokenStream, words: streamWords(err), cause: err})
	}
	return nil
}

// afterEvents is the check after a read's events, at now (the
// exchange's clock), on either relay (this one's reads, a loop's: pump):
// past the total deadline the stream ends; true when its replica is
// draining or gone from its pool and the grace period is over — the
// stream moves (migrate_resume.go).
func (r *relay) afterEvents(now time.Time) (leave bool) {
	x := r.x
	if err := x.s.to.totalPassed(x.received, now); err != nil {
		r.fail(err)
		return false
	}
	m := x.mig
	return m != nil && m.pol.DrainGrace > 0 && m.off == nil && !r.eof && m.leaving(x, now)
}

// aborted ends the stream for abort's reason: a client that left gets
// nothing more (the error stops the writer), anyone else an error event.
func (r *relay) aborted(err error) error {
	if errors.Is(err, ErrClientGone) {
		r.failure = err
		r.eof = true
		return err
	}
	r.fail(err)
	return nil
}

// upstreamFailed ends the stream with err — unless it can go on on another
// replica (migrate_resume.go). A stream draining off its replica that
// can't move finishes where it is.
func (r *relay) upstreamFailed(err error) {
	switch {
	case r.resume(err) || errors.Is(err, errLeaving):
		// Moved, or (leaving a drained replica, with nowhere to go) going
		// on where it is.
	case r.abortErr.Load() != nil:
		// The client left (or the router is stopping) while the stream
		// was moving: that ends it, not the replica it was moving from.
		r.aborted(*r.abortErr.Load()) //nolint:errcheck // the writer stops at eof
	default:
		r.fail(err)
	}
}

// process moves every complete event from in to out, recording timings
// at now (the exchange's clock, read once by the caller for every event
// of a read).
func (r *relay) process(now time.Time) {
	tracked := r.x.mig != nil
	rest := r.in
	for {
		k := openai.NextEvent(rest)
		if k < 0 {
			break
		}
		ev := rest[:k]
		rest = rest[k:]
		if r.sawDone {
			continue // nothing after [DONE] is part of the answer
		}
		payload := openai.EventData(ev)
		kind := openai.ClassifyEvent(payload, &r.hints)
		if tracked && (kind == openai.EventToken || kind == openai.EventChoice || kind == openai.EventUsageOnly) {
			r.tracked(ev, payload, kind, now) // migrate_track.go
			continue
		}
		switch kind {
		case openai.EventToken:
			r.x.tokenChunk(now) // the first is the TTFT: the first chunk with output, not a role-only one
			r.takeUsage(payload)
		case openai.EventChoice:
			r.takeUsage(payload)
		case openai.EventUsageOnly:
			r.takeUsage(payload)
			if r.strip {
				continue
			}
		case openai.EventDone:
			r.sawDone = true
		case openai.EventError:
			r.errEv = true
		}
		r.out = append(r.out, ev...)
	}
	n := copy(r.buf[:cap(r.buf)], rest)
	r.in = r.buf[:n]
}

func (r *relay) takeUsage(payload []byte) {
	if p, c, ok := openai.ReadUsage(payload); ok {
		r.x.promptTokens, r.x.completionTokens, r.x.gotUsage = int32(p), int32(c), true
	}
}

// fail ends the stream with an error event and [DONE], as OpenAI-compatible
// servers do once the status line is already sent.
func (r *relay) fail(err error) {
	if r.failure == nil {
		r.failure = err
	}
	r.out = append(r.out, "data: "...)
	r.out = appendErrorJSON(r.out, err)
	r.out = append(r.out, "\n\n"...)
	r.out = append(r.out, doneEvent...)
	r.eof = true
}

// CloseWithError is called once by fasthttp when it has finished writing
// the body; err is non-nil when writing to the client failed. It releases
// everything the request held: the watcher, the upstream stream (an unread
// stream's connection is closed, which aborts the engine's sequence), the
// response, the replica lease, and records the outcome.
func (r *relay) CloseWithError(err error) error {
	r.closeOnce.Do(func() {
		r.watch.stop()
		final := r.failure
		if final == nil && err != nil {
			final = fmt.Errorf("%w: %v", ErrClientGone, err)
		}
		if final == nil && !r.eof {
			final = ErrClientGone // closed before the end without a write error
		}
		if final == nil && r.errEv {
			final = fmt.Errorf("%w: error event in stream", ErrUpstream)
		}
		if !r.sawDone || final != nil {
			r.body.CloseWithError(errors.Join(final, errBrokenStream))
		} else {
			r.body.CloseWithError(nil)
		}
		if r.resp != nil { // nil after a failed migration, or once the stream loop took the body (startStream)
			fasthttp.ReleaseResponse(r.resp)
			r.resp = nil
		}
		if !r.x.lastTok.IsZero() && r.x.completionTokens == 0 && !r.x.gotUsage {
			r.x.completionTokens = int32(r.x.tokenChunks) // no usage: one chunk ≈ one token
		}
		r.x.finish(final, fasthttp.StatusOK)
		if m := r.x.mig; m != nil {
			m.release()
		}
		r.putBuf()
		r.buf, r.in, r.out = nil, nil, nil
	})
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout())
}
