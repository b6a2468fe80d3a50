package proxy

import (
	"net"
	"sync"
	"time"
)

// idleConns are a replica's keep-alive connections that the stream loop
// gives back (pump_linux.go): a stream taken from fasthttp takes its
// connection with it, out of fasthttp's pool, so once the stream has ended
// cleanly the connection waits here, and the replica's Dial hands it out
// before it dials — as fasthttp would have reused it. Its zero value is
// an empty set.
type idleConns struct {
	mu    sync.Mutex
	conns []idleConn // oldest first
}

type idleConn struct {
	c     net.Conn
	since time.Time
}

// maxIdleConns bounds the set: a burst of streams ending at once keeps no
// more connections than a replica's usual keep-alive pool would.
const maxIdleConns = 64

// put keeps c, closing the oldest connection when the set is full.
func (l *idleConns) put(c net.Conn, now time.Time) {
	l.mu.Lock()
	var drop net.Conn
	if len(l.conns) == maxIdleConns {
		drop = l.conns[0].c
		l.conns = append(l.conns[:0], l.conns[1:]...)
	}
	l.conns = append(l.conns, idleConn{c, now})
	l.mu.Unlock()
	if drop != nil {
		drop.Close() //nolint:errcheck
	}
}

// take returns the most recently kept connection idle for less than
// maxIdle, closing those idle longer (the engine may have closed them:
// uvicorn does after 5 s); nil when there is none.
func (l *idleConns) take(now time.Time, maxIdle time.Duration) net.Conn {
	l.mu.Lock()
	var stale []idleConn
	var c net.Conn
	for n := len(l.conns); n > 0; n = len(l.conns) {
		ic := l.conns[n-1]
		l.conns[n-1] = idleConn{}
		l.conns = l.conns[:n-1]
		if now.Sub(ic.since) < maxIdle {
			c = ic.c
			break
		}
		stale = append(stale, ic)
	}
	l.mu.Unlock()
	for _, ic := range stale {
		ic.c.Close() //nolint:errcheck
	}
	return c
}
