package proxy

import (
	"net"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/valyala/fasthttp"
)

// upstream is the router's connection to one replica: a HostClient with
// streaming reads and per-phase read deadlines, and the replica's
// pre-resolved metric children.
type upstream struct {
	replica *balancer.Replica
	pool    *balancer.Pool
	client  *fasthttp.HostClient
	all     *metrics
	byArm   []*replicaMetrics // children for the pool's arms at build time
}

func newUpstream(p *balancer.Pool, r *balancer.Replica, cfg Config, m *metrics) *upstream {
	u := &upstream{replica: r, pool: p, all: m}
	for _, a := range p.Arms() {
		u.byArm = append(u.byArm, m.forReplica(p.Model(), r.Name(), a.Name))
	}
	connect := m.connect.WithLabelValues(r.Name())
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	u.client = &fasthttp.HostClient{
		Addr:  r.Addr(),
		IsTLS: r.TLS(),
		Name:  "gpurouter",
		// Streams are read as they arrive; whole-response deadlines would cut
		// long generations, so ReadTimeout stays 0 and deadlineConn enforces
		// first-byte and idle-gap limits per read instead.
		StreamResponseBody:            true,
		MaxConns:                      cfg.MaxConnsPerReplica,
		MaxConnWaitTimeout:            cfg.ConnectTimeout,
		MaxIdleConnDuration:           cfg.MaxIdleConnTime,
		ConnPoolStrategy:              fasthttp.LIFO,
		WriteTimeout:                  cfg.IdleTimeout,
		DisableHeaderNamesNormalizing: true,
		NoDefaultUserAgentHeader:      true,
		MaxResponseBodySize:           cfg.MaxResponseBytes,
		Dial: func(addr string) (net.Conn, error) {
			start := time.Now()
			c, err := dialer.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			connect.Observe(time.Since(start).Seconds())
			return &deadlineConn{Conn: c, firstByte: cfg.FirstByteTimeout, idle: cfg.IdleTimeout}, nil
		},
	}
	return u
}

// metricsFor returns the children for arm; an arm added at run time (an
// operator changed the experiment) gets its children resolved on use.
func (u *upstream) metricsFor(arm string) *replicaMetrics {
	for _, m := range u.byArm {
		if m.arm == arm {
			return m
		}
	}
	return u.all.forReplica(u.pool.Model(), u.replica.Name(), arm)
}

// deadlineConn arms a read deadline before every read: FirstByte while
// waiting for the first byte of a response (the engine's queue and prefill),
// Idle between later reads (the gap between two stream events). fasthttp's
// own deadlines are absolute and would cut long streams, so they are
// ignored. Reads and writes of one request happen on one goroutine at a time,
// so awaiting needs no lock.
type deadlineConn struct {
	net.Conn
	firstByte time.Duration
	idle      time.Duration
	awaiting  bool // a request was written and no response byte read yet
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	c.awaiting = true
	return c.Conn.Write(p)
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	d := c.idle
	if c.awaiting {
		d = c.firstByte
	}
	if d > 0 {
		if err := c.Conn.SetReadDeadline(time.Now().Add(d)); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaiting = false
	}
	return n, err
}

// SetReadDeadline ignores fasthttp's absolute deadlines (it only ever
// clears them, as ReadTimeout is 0); Read sets its own.
func (c *deadlineConn) SetReadDeadline(time.Time) error { return nil }

// SetDeadline keeps the write side of fasthttp's deadline only.
func (c *deadlineConn) SetDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(t) }
