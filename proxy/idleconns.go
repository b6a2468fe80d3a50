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
// before it dials — as fasthttp would have reused it. Connections idle
// past maxIdle are closed whenever the set is used: on the replica's next
// dial or stream end. Its zero value is an empty set that keeps
// connections until they are taken.
type idleConns struct {
	maxIdle time.Duration // 0: no limit
	cap     *connCap      // the replica's count, which the connections closed here leave (nil: none)
	mu      sync.Mutex
	conns   []idleConn // oldest first
}

type idleConn struct {
	c     net.Conn
	since time.Time
}

// maxIdleConns bounds the set: a burst of streams ending at once keeps no
// more connections than a replica's usual keep-alive pool would.
const maxIdleConns = 64

// put keeps c, closing the oldest connection when the set is full and
// those idle past maxIdle — or closes c when its replica has its cap's
// worth of connections (conncap.go), so that a request loop, which can't
// take the set's, may dial.
func (l *idleConns) put(c net.Conn, now time.Time) {
	if l.cap != nil && l.cap.full() {
		c.Close() //nolint:errcheck
		l.cap.give()
		return
	}
	l.mu.Lock()
	drop := l.expire(now)
	if len(l.conns) == maxIdleConns {
		drop = append(drop, l.conns[0].c)
		l.conns = append(l.conns[:0], l.conns[1:]...)
	}
	l.conns = append(l.conns, idleConn{c, now})
	l.mu.Unlock()
	l.closeAll(drop)
}

// take returns the most recently kept connection, closing those idle past
// maxIdle (the engine may have closed them: uvicorn does after 5 s); nil
// when there is none.
func (l *idleConns) take(now time.Time) net.Conn {
	l.mu.Lock()
	drop := l.expire(now)
	var c net.Conn
	if n := len(l.conns); n > 0 {
		c = l.conns[n-1].c
		l.conns[n-1] = idleConn{}
		l.conns = l.conns[:n-1]
	}
	l.mu.Unlock()
	l.closeAll(drop)
	return c
}

// expire takes the connections idle past maxIdle out of the set (the
// oldest are first) and returns them, to be closed outside the lock.
func (l *idleConns) expire(now time.Time) []net.Conn {
	if l.maxIdle <= 0 {
		return nil
	}
	k := 0
	for k < len(l.conns) && now.Sub(l.conns[k].since) >= l.maxIdle {
		k++
	}
	if k == 0 {
		return nil
	}
	drop := make([]net.Conn, k)
	for i := range k {
		drop[i] = l.conns[i].c
	}
	n := copy(l.conns, l.conns[k:])
	clear(l.conns[n:])
	l.conns = l.conns[:n]
	return drop
}

// closeAll closes connections dropped from the set.
func (l *idleConns) closeAll(cs []net.Conn) {
	for _, c := range cs {
		c.Close() //nolint:errcheck
		l.cap.give()
	}
}
