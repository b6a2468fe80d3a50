package proxy

import (
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// clientWatch notices, while a response is in progress, that the client
// has gone or that the request must end for another reason (shutdown,
// total deadline), and aborts it. fasthttp reports a vanished client only
// through a failed write, and during an engine's prefill nothing is
// written, so a silent timer peeks at the client socket instead.
type clientWatch struct {
	x       *exchange
	raw     syscall.RawConn // nil when the client conn is not a plain socket (TLS, in-memory)
	abort   func(error)
	every   time.Duration
	timer   Timer
	stopped atomic.Bool
}

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

// startWatch arms a watch over conn that calls abort at most once.
func (s *Server) startWatch(x *exchange, conn net.Conn, abort func(error)) *clientWatch {
	w := &clientWatch{x: x, abort: abort, every: s.cfg.DisconnectCheck}
	// fasthttp arms a read deadline (the server's ReadTimeout) to read the
	// request and re-arms it before reading the next one; left in place it
	// would make every peek after it fail, so a long stream would look like
	// a vanished client.
	if conn != nil {
		conn.SetReadDeadline(time.Time{}) //nolint:errcheck
	}
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			w.raw = raw
		}
	}
	// tick reads w.timer: arm it only once the field is set (Reset orders
	// the write before the tick, for the race detector as for the CPU).
	w.timer = s.newTimer(time.Duration(math.MaxInt64), w.tick)
	w.timer.Reset(w.every)
	return w
}

func (w *clientWatch) tick() {
	if w.stopped.Load() {
		return
	}
	s := w.x.s
	switch {
	case w.raw != nil && peerClosed(w.raw):
		w.abort(fmt.Errorf("%w: connection closed by client", ErrClientGone))
		return
	case s.abortStreams.Load():
		w.abort(fmt.Errorf("%w: drain deadline passed", ErrShuttingDown))
		return
	case s.totalExceeded(w.x):
		w.abort(fmt.Errorf("%w: total request deadline %s", ErrTimeout, s.cfg.TotalTimeout))
		return
	}
	w.timer.Reset(w.every)
}

// stop ends the watch; safe to call more than once and on a nil watch.
func (w *clientWatch) stop() {
	if w == nil {
		return
	}
	w.stopped.Store(true)
	w.timer.Stop()
}
