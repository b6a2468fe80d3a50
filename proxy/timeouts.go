package proxy

import (
	"fmt"
	"time"
)

// The router's time limits, one table. Config holds the operator's values
// (timeouts.* in the file); each path arms them its own way — the
// goroutine path as socket deadlines (deadlineConn, relay.armWrite) and
// a timer (clientWatch), a request loop by its scans (reqloop_linux.go) —
// and judges and words them here.
//
//	limit              runs from → to                                         when it passes
//	connect            dialing a replica → connected                          the attempt fails: another replica
//	first byte         request sent → the answer's first byte;                before the head: the attempt fails;
//	                   a stream's head → its first event                      after: 504, or an error event
//	idle               between two reads of an answer; one write to a client  the answer ends (the client is gone)
//	total              request received → its end (0: none)                   504, or an error event
//	read               a request's first byte → all of it (slowloris)         408, the connection closes
//	keep-alive         a client's connection idle between requests            the connection closes
//	engine keep-alive  an engine's connection idle in a pool                  the connection closes
//	drain              Shutdown's context                                     streams end with an error event
type timeouts struct {
	connect, firstByte, idle, total, read time.Duration
	keepAlive, engineKeepAlive            time.Duration
}

// clientKeepAlive is how long a client's keep-alive connection may wait
// for its next request, on either path.
const clientKeepAlive = 2 * time.Minute

func newTimeouts(c Config) timeouts {
	return timeouts{connect: c.ConnectTimeout, firstByte: c.FirstByteTimeout, idle: c.IdleTimeout, total: c.TotalTimeout,
		read: c.ReadTimeout, keepAlive: clientKeepAlive, engineKeepAlive: c.MaxIdleConnTime}
}

// readLimit is how long a read of an engine's answer may wait: for its
// first byte (begun false: the engine's queue and prefill), else since
// the last (the gap between two stream events).
func (t *timeouts) readLimit(begun bool) time.Duration {
	if begun {
		return t.idle
	}
	return t.firstByte
}

// readLate reports that an answer whose request went at sent, and whose
// last byte came at last (zero: none yet), has waited past readLimit at
// now: what a socket deadline says on the goroutine path.
func (t *timeouts) readLate(sent, last, now time.Time) bool {
	if last.IsZero() {
		return now.Sub(sent) > t.firstByte
	}
	return now.Sub(last) > t.idle
}

// totalPassed is the error that ends a request received at received once
// the total deadline has passed at now; nil before, or without one.
func (t *timeouts) totalPassed(received, now time.Time) error {
	if t.total <= 0 || now.Sub(received) <= t.total {
		return nil
	}
	return fmt.Errorf("%w: total request deadline %s", ErrTimeout, t.total)
}

// noFirstEvent and noEvent end a stream whose engine sent its head but
// not its first event in time, or no event for the idle timeout.
func (t *timeouts) noFirstEvent() error {
	return fmt.Errorf("%w: no first stream event within %s", ErrTimeout, t.firstByte)
}

func (t *timeouts) noEvent() error {
	return fmt.Errorf("%w: no stream event for %s", ErrTimeout, t.idle)
}

// requestLate answers a client whose request did not arrive whole in time.
func (t *timeouts) requestLate() error {
	return fmt.Errorf("%w: the request must arrive within %s", ErrRequestTimeout, t.read)
}

// errDrainPassed ends what is still running once Shutdown's context ends.
var errDrainPassed = fmt.Errorf("%w: drain deadline passed", ErrShuttingDown)
