package proxy

import (
	"fmt"
	"github.com/gpurouter/gpurouter/internal/netloop"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// clientWatch notices, while a response is in progress, that the client
// has gone or that the request must end for another reason (shutdown,
// total deadline), and aborts it. fasthttp reports a vanished client only
// through a failed write, and during an engine's prefill nothing is
// written, so a silent timer peeks at the client socket instead.
//
// Most requests end long before the first check, so a watch costs one
// timer until then: the client connection is prepared for peeking (its
// read deadline cleared, its socket looked up) by the first check, not
// when the watch starts.
//
// One watch serves a request from its first attempt to the end of its
// response: its abort goes to whoever can end the request at the time
// (retarget) — the pending upstream request, then the response's reader.
type clientWatch struct {
	x     *exchange
	conn  net.Conn
	every time.Duration

	mu      sync.Mutex // orders the first check's setup against stop; guards abort and fired
	abort   aborter    // who ends the request now; nil between owners
	fired   error      // why the watch fired: handed to every later owner too
	timer   Timer
	raw     syscall.RawConn // nil when the client conn is not a plain socket (TLS, in-memory)
	ready   bool            // the first check has prepared conn
	paused  bool            // the stream loop watches the client meanwhile (pump_linux.go)
	stopped atomic.Bool
}

// aborter is who can end a request at a given time: the pending upstream
// request (*pendingReq), the relay (*relay), a wait (abortFunc). An
// interface, not a func: a pointer becomes one without an allocation, a
// method value does not.
type aborter interface{ abort(error) }

// abortFunc is a function as an aborter.
type abortFunc func(error)

func (f abortFunc) abort(err error) { f(err) }

// Timer is the part of *time.Timer a watch uses: what Options.AfterFunc
// returns, so tests can fire a watch's checks by hand instead of waiting
// for DisconnectCheck.
type Timer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

// newTimer arms a timer with the server's injected factory, or with
// time.AfterFunc when Options.AfterFunc was nil.
func (s *Server) newTimer(d time.Duration, f func()) Timer {
	if s.afterFunc != nil {
		return s.afterFunc(d, f)
	}
	return time.AfterFunc(d, f)
}

// startWatch arms a watch over conn that calls abort (or its later owners,
// retarget) at most once each.
func (s *Server) startWatch(x *exchange, conn net.Conn, abort aborter) *clientWatch {
	w := &clientWatch{x: x, conn: conn, abort: abort, every: s.cfg.DisconnectCheck}
	// abort may be nil: a watch started before its first owner (retarget).
	// tick reads w.timer under mu: set it under mu too, for the race
	// detector as for the CPU.
	w.mu.Lock()
	w.timer = s.newTimer(w.every, w.tick)
	w.mu.Unlock()
	return w
}

// prepare readies conn for peeking, once, unless the watch has stopped
// (the request is over and fasthttp may be arming the next one's read
// deadline): false then.
func (w *clientWatch) prepare() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped.Load() {
		return false
	}
	if w.ready {
		return true
	}
	w.ready = true
	// fasthttp arms a read deadline (the server's ReadTimeout) to read the
	// request and re-arms it before reading the next one; left in place it
	// would make every peek after it fail, so a long stream would look like
	// a vanished client.
	if w.conn != nil {
		w.conn.SetReadDeadline(time.Time{}) //nolint:errcheck
	}
	if sc, ok := w.conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			w.raw = raw
		}
	}
	return true
}

func (w *clientWatch) tick() {
	if !w.prepare() {
		return
	}
	s := w.x.s
	switch {
	case w.raw != nil && netloop.PeerClosed(w.raw):
		w.fire(fmt.Errorf("%w: connection closed by client", ErrClientGone))
		return
	case s.abortStreams.Load():
		w.fire(errDrainPassed)
		return
	}
	if err := s.to.totalPassed(w.x.received, s.now()); err != nil {
		w.fire(err)
		return
	}
	w.mu.Lock()
	t, paused := w.timer, w.paused
	w.mu.Unlock()
	if !paused {
		t.Reset(w.every)
	}
}

// pause stops the checks while the stream loop watches the client itself
// (an epoll event when it hangs up), which costs nothing per stream; a
// check already running may still run once. resume starts them again.
func (w *clientWatch) pause() {
	w.mu.Lock()
	w.paused = true
	t := w.timer
	w.mu.Unlock()
	t.Stop()
}

func (w *clientWatch) resume() {
	w.mu.Lock()
	w.paused = false
	t := w.timer
	w.mu.Unlock()
	if !w.stopped.Load() {
		t.Reset(w.every)
	}
}

// fire ends the request for err through its current owner. The watch
// checks no more (every reason it fires for is final), and an owner that
// takes over later is told at once: the one it fired at may have been
// done already (an upstream request that had just been answered).
func (w *clientWatch) fire(err error) {
	w.mu.Lock()
	w.fired = err
	a := w.abort
	w.mu.Unlock()
	if a != nil {
		a.abort(err)
	}
}

// retarget makes a the one a firing watch aborts (nil: no one for now);
// a is told at once when the watch has fired already.
func (w *clientWatch) retarget(a aborter) {
	w.mu.Lock()
	w.abort = a
	fired := w.fired
	w.mu.Unlock()
	if fired != nil && a != nil {
		a.abort(fired)
	}
}

// why is why the watch fired, nil if it has not (or w is nil).
func (w *clientWatch) why() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fired
}

// stop ends the watch; safe to call more than once and on a nil watch.
func (w *clientWatch) stop() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.stopped.Store(true)
	t := w.timer
	w.mu.Unlock()
	t.Stop()
}
