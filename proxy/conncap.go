package proxy

import (
	"sync/atomic"

	"github.com/valyala/fasthttp"
)

// connCap holds a replica's connections to upstream.max_conns_per_replica
// across both request paths: each is counted from its dial — by a request
// loop (reqloop_upstream_linux.go) or fasthttp's client (upstream.go) — to
// its close, whoever holds it then: fasthttp's pool or the replica's idle
// set (idleConns), a stream's relay, a loop. Each stream holds one for its
// whole life, so the cap is the replica's concurrent streams. A nil
// *connCap counts nothing.
type connCap struct {
	n   atomic.Int64
	max int64
}

// errNoFreeConns is a dial refused for the cap, in fasthttp's words for
// the same (upfail.go says them to the client).
var errNoFreeConns = fasthttp.ErrNoFreeConns

// take counts a connection about to be dialed; false when the replica has
// its cap's worth already.
func (c *connCap) take() bool {
	if c.n.Add(1) > c.max {
		c.n.Add(-1)
		return false
	}
	return true
}

// add counts a second descriptor of a socket already counted, each of
// which is given back when it closes (detach's duplicate).
func (c *connCap) add() {
	if c != nil {
		c.n.Add(1)
	}
}

// give takes a closed connection off the count.
func (c *connCap) give() {
	if c != nil {
		c.n.Add(-1)
	}
}

// full reports that the replica has its cap's worth of connections: an
// idle one is closed rather than kept (a path can't take the other's).
func (c *connCap) full() bool { return c.n.Load() >= c.max }

// open is the replica's connections now.
func (c *connCap) open() int64 { return c.n.Load() }
