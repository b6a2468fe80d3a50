package proxy

import (
	"bytes"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/netloop"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/gpurouter/gpurouter/proxy/observe"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// upstream is the router's connection to one replica: a HostClient with
// streaming reads and per-phase read deadlines, and the replica's
// pre-resolved metric children.
type upstream struct {
	replica *balancer.Replica
	pool    *balancer.Pool
	client  upstreamClient // a *fasthttp.HostClient, but for benchmarks of the router's own work
	all     *metrics
	byArm   []*replicaMetrics       // children for the pool's arms at build time
	lat     *observe.ReplicaLatency // the replica's ITL and queue-time sketches (latency.go)
	pending pendingSet              // requests sent and not yet answered
	idle    idleConns               // connections streams taken from fasthttp gave back (pump_linux.go)
	connect prometheus.Observer     // the replica's connect-time histogram child
	// cap counts the replica's connections, both paths', held to
	// MaxConnsPerReplica (conncap.go).
	cap connCap
}

// upstreamClient sends a request to a replica and reads its response's
// head (the body is streamed when resp.StreamBody is set): what send
// needs of fasthttp's HostClient.
type upstreamClient interface {
	Do(req *fasthttp.Request, resp *fasthttp.Response) error
}

func newUpstream(p *balancer.Pool, r *balancer.Replica, cfg Config, to *timeouts, m *metrics, lat *observe.Latency) *upstream {
	u := &upstream{replica: r, pool: p, all: m, lat: lat.Replica(p.Model(), r.Name())}
	u.cap.max = int64(cfg.MaxConnsPerReplica)
	u.idle.maxIdle, u.idle.cap = cfg.MaxIdleConnTime, &u.cap
	for _, a := range p.Arms() {
		u.byArm = append(u.byArm, m.forReplica(p.Model(), r.Name(), a.Name))
	}
	connect := m.connect.WithLabelValues(r.Name())
	u.connect = connect
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
		// The connection's read buffer is held for a stream's whole life;
		// fasthttp's 4 KiB default is four times what an engine's head
		// needs (Config.MaxUpstreamHeader).
		ReadBufferSize: cfg.MaxUpstreamHeader,
		// A request that finds its pooled connection closed by the engine
		// (see staleRetry) is resent on another one, as many times as the
		// pool may hold dead connections, plus the fresh one.
		RetryIfErr:                staleRetry(&u.pending, m.stale.WithLabelValues(r.Name())),
		MaxIdemponentCallAttempts: cfg.MaxConnsPerReplica + 1,
		Dial: func(addr string) (net.Conn, error) {
			if c := u.idle.take(time.Now()); c != nil {
				// Reused: a request that finds it closed by the engine is
				// resent (staleRetry), as on one of fasthttp's own.
				return (&deadlineConn{Conn: c, to: to, pending: &u.pending, uses: 1, cap: &u.cap}).withSock(), nil
			}
			if !u.cap.take() {
				return nil, errNoFreeConns // the loops hold the rest
			}
			start := time.Now()
			c, err := dialOffStack(dialer, addr)
			if err != nil {
				u.cap.give()
				return nil, err
			}
			connect.Observe(time.Since(start).Seconds())
			return (&deadlineConn{Conn: c, to: to, pending: &u.pending, cap: &u.cap}).withSock(), nil
		},
	}
	return u
}

// dialOffStack dials on a goroutine of its own. Dialing runs deep (the
// resolver, the socket setup) and would double the stack of the request's
// goroutine — which, for a stream, then waits with it for the whole
// generation: 8 KiB more per stream, for a connection made once.
func dialOffStack(d *net.Dialer, addr string) (net.Conn, error) {
	type dialed struct {
		c   net.Conn
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		c, err := d.Dial("tcp", addr)
		ch <- dialed{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// staleRetry is the upstream client's retry rule: a request is resent only
// when it failed on a reused keep-alive connection before any response
// byte because the engine had closed it (EOF or reset on the write or the
// first read) — llama.cpp closes after every
// response while advertising keep-alive, uvicorn closes idle connections
// after 5 s, and sidecars do the same. The engine never saw that request,
// so resending it is safe, costs no attempt and blames no one: the client
// must not pay for the router's stale connection. Any other failure is the
// replica's (and the router's retry across replicas decides what next).
func staleRetry(ps *pendingSet, resent prometheus.Counter) fasthttp.RetryIfErrFunc {
	return func(req *fasthttp.Request, _ int, _ error) (bool, bool) {
		pr := ps.byHeader(req.Header.Peek(seqHeader))
		if pr == nil || !pr.stale.Swap(false) {
			return false, false
		}
		resent.Inc()
		return false, true
	}
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

// deadlineConn keeps a read deadline in force for every read (armRead:
// moved only when it drifts out of its window): FirstByte until the first
// byte of the response body (the engine's queue and prefill —
// vLLM sends a stream's headers at once, then the first event after
// prefill), Idle between later reads (the gap between two stream events).
// fasthttp's own deadlines are absolute and would cut long streams, so
// they are ignored. Reads and writes of one request happen on one
// goroutine at a time, so the fields need no lock.
type deadlineConn struct {
	net.Conn
	to       *timeouts   // readLimit: first byte, then idle
	sent     bool        // a request was written and no response byte read yet
	awaiting bool        // no byte of the response body read yet
	headEnd  int         // bytes of the head's closing CRLF CRLF seen so far
	headPos  int         // bytes of the head seen so far
	status   byte        // the head's status code's first digit, once seen
	uses     int         // requests written on the connection, this one included
	cur      *pendingReq // the request being written or awaited; nil if not the router's
	pending  *pendingSet // where the request being written is expected
	armed    time.Time   // the read deadline set on Conn (armRead); zero if none
	wroteAt  time.Time   // when cur was written, when it asked (pendingReq.timed)

	// A stream's response head is handed to fasthttp alone (limitHead),
	// the body bytes that came with it kept in stash: fasthttp then holds
	// nothing past the head, and the stream's socket can be taken from it
	// (headCut; pump_linux.go's detach).
	limitHead bool
	headCut   bool
	stash     []byte

	sock netloop.RawSock // Linux: the socket's raw reads and writes (rawsock_linux.go)
	// cap is the replica's connection count, given back when fasthttp
	// closes the connection (nil: not counted, or given back already).
	cap *connCap
}

// Close closes the connection and takes it off its replica's count.
func (c *deadlineConn) Close() error {
	c.cap.give()
	c.cap = nil
	return c.Conn.Close()
}

// withSock sets c's raw socket I/O where the system has it.
func (c *deadlineConn) withSock() *deadlineConn {
	c.sock.Set(c.Conn)
	return c
}

func (c *deadlineConn) readConn(p []byte) (int, error) {
	if c.sock.OK() {
		return c.sock.Read(p)
	}
	return c.Conn.Read(p)
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	if !c.sent {
		// A request starts (its head is in this first write): tell its
		// exchange which connection to close should its client leave.
		c.cur = c.pending.of(p)
		if c.cur != nil && !c.cur.attach(c.Conn) {
			return 0, net.ErrClosed // the client has already left
		}
		c.sent, c.awaiting, c.headEnd, c.headPos, c.status = true, true, 0, 0, 0
		c.limitHead, c.headCut, c.stash = c.cur != nil && c.cur.stream, false, nil
		if c.cur != nil {
			c.cur.dconn = c
			if c.cur.timed {
				c.wroteAt = time.Now() // a connection is the request's
			}
		}
		// A pooled connection the engine has closed since its last
		// response is not looked at before writing (a syscall on every
		// request): the write lands in the kernel, the engine's end
		// answers with a reset, and the read below flags the request.
		c.uses++
	}
	var n int
	var err error
	if c.sock.OK() {
		n, err = c.sock.Write(p)
	} else {
		n, err = c.Conn.Write(p)
	}
	if err != nil && c.awaiting && peerClosedErr(err) {
		c.markStale()
	}
	return n, err
}

// markStale flags the request being written for a resend on another
// connection (staleRetry) when this connection was reused: a fresh one
// failing is the replica's fault, not the pool's.
func (c *deadlineConn) markStale() {
	if c.uses > 1 && c.cur != nil {
		c.cur.stale.Store(true)
	}
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	if len(c.stash) > 0 { // the body bytes that came with a stream's head
		n := copy(p, c.stash)
		c.stash = c.stash[n:]
		return n, nil
	}
	if err := c.armRead(c.to.readLimit(!c.awaiting)); err != nil {
		return 0, err
	}
	n, err := c.readConn(p)
	if n > 0 {
		c.sent = false
		if c.awaiting {
			k := c.headAt(p[:n])
			c.awaiting = k < 0 || k == n
			if k >= 0 && c.limitHead {
				c.limitHead, c.headCut = false, true
				if k < n {
					c.stash = append([]byte(nil), p[k:n]...)
					n = k
				}
			}
		}
	}
	if err != nil && n == 0 && c.sent && peerClosedErr(err) {
		c.markStale() // closed after the request, before any response byte
	}
	return n, err
}

// armRead makes the read deadline fall between d and d+slack from now.
// A stream reads once per event; setting the deadline on each read (the
// runtime's timer lock, a clock read) cost more than the event's own
// bookkeeping, so while the armed deadline stays within that window it is
// left alone: it moves about once per slack, and fires at most slack late
// (a sixteenth of the limit, at most a second). d = 0 clears it.
func (c *deadlineConn) armRead(d time.Duration) error {
	if d <= 0 {
		if c.armed.IsZero() {
			return nil
		}
		c.armed = time.Time{}
		return c.Conn.SetReadDeadline(c.armed)
	}
	want := time.Now().Add(d)
	slack := min(d/16, time.Second)
	if !c.armed.Before(want) && !c.armed.After(want.Add(slack)) {
		return nil
	}
	c.armed = want.Add(slack)
	return c.Conn.SetReadDeadline(c.armed)
}

// headAt follows the response head's end through b: the index in b just
// past the head (0 when it ended before b), or -1 when the head goes on.
// An informational (1xx) head, which fasthttp reads and skips, is not the
// end: the head is the one after it.
func (c *deadlineConn) headAt(b []byte) int {
	const crlf2 = "\r\n\r\n"
	for i, ch := range b {
		if c.headEnd == len(crlf2) {
			if c.status != '1' {
				return i
			}
			c.headEnd, c.headPos, c.status = 0, 0, 0 // the next head follows
		}
		if c.headPos == len("HTTP/1.1 ") {
			c.status = ch // the status code's first digit
		}
		c.headPos++
		switch {
		case ch == crlf2[c.headEnd]:
			c.headEnd++
		case ch == '\r':
			c.headEnd = 1
		default:
			c.headEnd = 0
		}
	}
	if c.headEnd == len(crlf2) && c.status != '1' {
		return len(b)
	}
	return -1
}

// SetReadDeadline ignores fasthttp's absolute deadlines (it only ever
// clears them, as ReadTimeout is 0); Read sets its own.
func (c *deadlineConn) SetReadDeadline(time.Time) error { return nil }

// SetDeadline keeps the write side of fasthttp's deadline only.
func (c *deadlineConn) SetDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(t) }

// pendingSet holds, by the router's request number, the requests sent to a
// replica whose response has not started. A client can leave while an
// engine works on a request without answering yet — a whole non-streamed
// generation, a long prefill — and fasthttp's client can't be interrupted:
// closing the connection is what stops the wait, and what tells the engine
// to abort. The connection is found by the X-Gpurouter-Seq in the request's
// head. Its zero value is an empty set.
//
// The set is a few maps under their own locks, by the number's low bits:
// numbers come in sequence, so the shards share the load. A sync.Map
// boxed each number and made a node for it, two heap objects a request,
// where a map reuses its slots.
type pendingSet struct{ shards [pendingShards]pendingShard }

const pendingShards = 8

// pendingShard is one of a pendingSet's maps, on a cache line of its own:
// requests on different cores take different shards.
type pendingShard struct {
	mu sync.Mutex
	m  map[uint64]*pendingReq // made on the first request
	_  [48]byte
}

func (s *pendingSet) shard(seq uint64) *pendingShard { return &s.shards[seq%pendingShards] }

// seqHeader carries the router's number of a request to its replica.
const seqHeader = "X-Gpurouter-Seq"

const seqLine = "\r\n" + seqHeader + ": "

// expect registers the request numbered seq before it is sent.
func (s *pendingSet) expect(seq uint64, stream bool) *pendingReq {
	pr := &pendingReq{stream: stream}
	sh := s.shard(seq)
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = make(map[uint64]*pendingReq)
	}
	sh.m[seq] = pr
	sh.mu.Unlock()
	return pr
}

// settle ends pr's wait (the response started, or the attempt failed) and
// returns why it was aborted, nil if it wasn't.
func (s *pendingSet) settle(seq uint64, pr *pendingReq) error {
	if pr == nil {
		return nil
	}
	sh := s.shard(seq)
	sh.mu.Lock()
	if sh.m[seq] == pr {
		delete(sh.m, seq)
	}
	sh.mu.Unlock()
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.done, pr.conn = true, nil
	return pr.cause
}

// of finds the pending request whose head is head.
func (s *pendingSet) of(head []byte) *pendingReq {
	if s == nil {
		return nil
	}
	i := strings.Index(openai.BytesView(head), seqLine)
	if i < 0 {
		return nil
	}
	num := head[i+len(seqLine):]
	j := bytes.IndexByte(num, '\r')
	if j < 0 {
		return nil
	}
	return s.byHeader(num[:j])
}

// byHeader finds the pending request numbered by a seqHeader value.
func (s *pendingSet) byHeader(v []byte) *pendingReq {
	seq, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return nil
	}
	sh := s.shard(seq)
	sh.mu.Lock()
	pr := sh.m[seq]
	sh.mu.Unlock()
	return pr
}

// pendingReq is one request awaiting its response.
type pendingReq struct {
	mu    sync.Mutex
	conn  net.Conn // the connection it went out on (the last, after a resend)
	cause error    // why it was aborted; nil while it wasn't
	done  bool     // settled: abort no longer applies
	// stale is set when the request failed on a reused connection the
	// engine had closed, and taken by staleRetry.
	stale atomic.Bool
	// stream: a streamed response is asked for, whose head its connection
	// hands to fasthttp alone (deadlineConn.limitHead). dconn is the
	// connection the request was last written on; both are used only on
	// the request's goroutine.
	stream bool
	dconn  *deadlineConn
	// timed asks dconn for wroteAt, when the request was written on it
	// (the attempt's span marks it).
	timed bool
}

// attach records the connection the request is written on; false when
// the request was already aborted.
func (pr *pendingReq) attach(c net.Conn) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if !pr.done {
		pr.conn = c
	}
	return pr.cause == nil
}

// abort ends the wait for err's reason by closing the connection (now, or
// as soon as the request is written). Safe on nil and more than once.
func (pr *pendingReq) abort(err error) {
	if pr == nil {
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.done || pr.cause != nil {
		return
	}
	pr.cause = err
	if pr.conn != nil {
		pr.conn.Close()
	}
}
