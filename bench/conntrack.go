package bench

import (
	"context"
	"net"
	"sync"
	"time"
)

// DialError wraps a failure to open a connection, so a Record can tell
// "connect" failures from failures on an open connection.
type DialError struct{ Err error }

func (e *DialError) Error() string { return "dial: " + e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// connTracker dials the HostClient's connections and remembers them, so a
// cancelled run can close every one and unblock every read at once (fasthttp
// reads have no context). The zero value is not usable; use newConnTracker.
type connTracker struct {
	ctx    context.Context
	dialer net.Dialer

	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

func newConnTracker(ctx context.Context) *connTracker {
	return &connTracker{ctx: ctx, dialer: net.Dialer{Timeout: 10 * time.Second}, conns: make(map[*trackedConn]struct{})}
}

// dial has fasthttp's Dial signature.
func (t *connTracker) dial(addr string) (net.Conn, error) {
	c, err := t.dialer.DialContext(t.ctx, "tcp", addr)
	if err != nil {
		return nil, &DialError{Err: err}
	}
	tc := &trackedConn{Conn: c, t: t}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return nil, &DialError{Err: context.Canceled}
	}
	t.conns[tc] = struct{}{}
	t.mu.Unlock()
	return tc, nil
}

// closeAll closes every open connection and refuses new ones.
func (t *connTracker) closeAll() {
	t.mu.Lock()
	t.closed = true
	conns := make([]*trackedConn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

type trackedConn struct {
	net.Conn
	t    *connTracker
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}
