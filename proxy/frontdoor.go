package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/internal/h1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// The front door: every request passes h1's request grammar before
// anything acts on it, on whichever path it is served. The request loops
// check each head as they read it (serveOne). On fasthttp's path — the
// connections a loop hands off, every connection with
// upstream.goroutine_requests, every one on systems without loops — the
// client connection fasthttp reads (prefetchConn) frames what it hands
// on: it reads each request's head whole before fasthttp sees a byte of
// it, checks it, and then gives fasthttp that request and nothing past
// it — the head and a Content-Length body as they came, or a chunked
// request rewritten with its body decoded (h1.Chunked, the one reader of
// chunked framing), so that fasthttp's own parser meets only heads the
// grammar took, one at a time, pipelined ones included, and no chunked
// framing at all. A request the grammar refuses is answered with its
// status (400, 431, 501, 505; 408 and 413 for a request too slow or a
// chunked body too large) and its connection closed: what follows the
// refused bytes cannot be told apart from them.

// frontDoor is what frames a client connection's reads on fasthttp's
// path, and answers the requests refused on either path. Immutable once
// the Server is built.
type frontDoor struct {
	lim         h1.Limits
	maxBody     int
	readTimeout time.Duration // a request must arrive within this from its first byte
	name        string        // the answers' Server field; "" none
	refused     *prometheus.CounterVec
}

func newFrontDoor(cfg Config, name string, refused *prometheus.CounterVec) *frontDoor {
	return &frontDoor{
		lim:         h1.Limits{MaxHead: cfg.MaxHeaderBytes},
		maxBody:     cfg.MaxBodyBytes,
		readTimeout: cfg.ReadTimeout,
		name:        name,
		refused:     refused,
	}
}

// errRefused ends fasthttp's read of a connection whose request the front
// door refused and answered (prefetchConn.refuse): fasthttp reads, and
// answers, nothing more on it.
var errRefused = errors.New("proxy: request refused at the front door")

// refusal is the answer to a request refused before anything acted on
// it: err's status and OpenAI error, and Connection: close.
func (d *frontDoor) refusal(err error) []byte {
	var resp fasthttp.Response
	setError(&resp, err)
	resp.SetConnectionClose()
	if d.name != "" {
		resp.Header.SetServer(d.name)
	}
	var b bytes.Buffer
	resp.WriteTo(&b) //nolint:errcheck // a bytes.Buffer takes every byte
	return b.Bytes()
}

// refuse answers the request refused with err, on c, and closes c
// (lingering: the client may still be sending it). It returns the error
// c's reads end with from now on. Called by the goroutine reading c (or
// the one a request loop gives a connection to for this).
func (c *prefetchConn) refuse(err error) error {
	d := c.door
	d.refused.WithLabelValues(strconv.Itoa(statusOf(err))).Inc()
	c.ended = fmt.Errorf("%w: %w", errRefused, err)
	// A deadline is the netpoller's wall clock: nothing to inject. The
	// answer is small: a client that takes none of it in this time is
	// not waited on.
	if c.SetWriteDeadline(time.Now().Add(lingerTime)) == nil {
		c.Write(d.refusal(err)) //nolint:errcheck // the client may be gone: it is closed either way
	}
	c.lingerOnClose()
	c.Close() //nolint:errcheck
	return c.ended
}

// frameState is a client connection's progress through its requests at
// the front door (prefetchConn.readFramed).
type frameState struct {
	scan h1.RequestScan
	// left is what fasthttp may still read of the request in progress;
	// 0: the next request's head is to be checked first.
	left int64
	// out is a chunked request rewritten in Content-Length form, given
	// out before anything else; nil when none.
	out   []byte
	ended error // the refusal, for good: nothing more is read
}

// readFramed is Read at the front door: fasthttp gets the request in
// progress, and the next one only once its head has been read whole and
// checked.
func (c *prefetchConn) readFramed(p []byte) (int, error) {
	if c.ended != nil {
		return 0, c.ended
	}
	if c.left == 0 {
		if err := c.nextRequest(); err != nil {
			return 0, err
		}
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	if c.out != nil {
		n := copy(p, c.out)
		c.out = c.out[n:]
		if c.left -= int64(n); c.left == 0 {
			c.out = nil
		}
		return n, nil
	}
	n, err := c.readAhead(p)
	c.left -= int64(n)
	return n, err
}

// nextRequest reads the next request's head into the read-ahead buffer
// and checks it: a head the grammar takes makes the request what
// fasthttp may read (c.left), a refused one is answered (refuse). An
// error ends fasthttp's reading: a connection idle or gone, or refused.
func (c *prefetchConn) nextRequest() error {
	c.scan.Reset()
	timed := false
	for {
		r, err := c.scan.Scan(c.unread(), c.door.lim)
		if err != nil {
			return c.refuse(err)
		}
		if r.Complete() {
			c.r += r.Start // empty lines before the request line: dropped
			if r.Chunked() {
				return c.dechunk(r.HeadEnd - r.Start)
			}
			c.left = int64(r.HeadEnd-r.Start) + r.Length
			return nil
		}
		begun := c.w-c.r > r.Start // bytes of a request, not only empty lines
		if begun && !timed {
			// fasthttp gives a request the read timeout from its first
			// byte; the connection's deadline is still the one for its
			// wait (the idle timeout), as fasthttp has not seen that byte.
			timed = c.SetReadDeadline(time.Now().Add(c.door.readTimeout)) == nil
		}
		if err := c.fill(); err != nil {
			return c.readFailed(err, begun)
		}
	}
}

// readFailed is what a failed read of the socket (err) means while a
// request is read whole before fasthttp sees it: a request begun and not
// sent in time is answered 408, as fasthttp would; anything else ends
// the connection as it would have ended fasthttp's read.
func (c *prefetchConn) readFailed(err error, begun bool) error {
	var ne net.Error
	if begun && errors.As(err, &ne) && ne.Timeout() {
		return c.refuse(fmt.Errorf("%w: the request must arrive within %s", ErrRequestTimeout, c.door.readTimeout))
	}
	return err
}

// dechunk reads the body of the chunked request whose head, of headLen
// bytes, starts the read-ahead buffer, and makes what fasthttp reads the
// same request in Content-Length form: the head without its
// Transfer-Encoding (nor an Expect: 100-continue, answered here), a
// Content-Length, and the body decoded. Trailer fields are dropped, as
// fasthttp drops those it does not allow.
func (c *prefetchConn) dechunk(headLen int) error {
	head := c.unread()[:headLen]
	out, expect := appendFramedHead(make([]byte, 0, headLen+64), head)
	c.r += headLen
	// The body must come within the read timeout too. A connection that
	// cannot take a deadline is closed, or its peer is: reads tell.
	c.SetReadDeadline(time.Now().Add(c.door.readTimeout)) //nolint:errcheck
	if expect && c.w == c.r {
		// The client waits for this before it sends the body; one that
		// sent some already gets none (RFC 9110 §10.1.1).
		if _, err := c.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n")); err != nil {
			return err
		}
	}
	d := h1.Chunked{MaxTrailer: c.door.lim.MaxHead}
	body := len(out)
	for !d.Done() {
		if c.w == c.r {
			if err := c.fill(); err != nil {
				return c.readFailed(err, true)
			}
		}
		data, k, err := d.Next(c.unread(), math.MaxInt)
		c.r += k
		if err != nil {
			return c.refuse(h1.MalformedBody(err))
		}
		if len(out)-body+len(data) > c.door.maxBody {
			return c.refuse(fmt.Errorf("%w: limit is %d bytes", ErrBodyTooLarge, c.door.maxBody))
		}
		out = append(out, data...)
	}
	c.releaseDrained()
	n := len(out) - body
	// The Content-Length goes last in the head: the body is moved along
	// by its length.
	cl := strconv.AppendInt([]byte("Content-Length: "), int64(n), 10)
	cl = append(cl, "\r\n\r\n"...)
	out = append(out, cl...)
	copy(out[body+len(cl):], out[body:body+n])
	copy(out[body:], cl)
	c.out, c.left = out, int64(len(out))
	return nil
}

// appendFramedHead appends head — a chunked request's, which the grammar
// took — without its Transfer-Encoding and Expect: 100-continue fields
// and without its empty line, for a Content-Length to end it; expect
// reports the Expect dropped.
func appendFramedHead(dst, head []byte) (out []byte, expect bool) {
	i := bytes.IndexByte(head, '\n') + 1
	dst = append(dst, head[:i]...) // the request line
	for rest := head[i : len(head)-2]; len(rest) > 0; {
		j := bytes.IndexByte(rest, '\n') + 1
		line := rest[:j]
		rest = rest[j:]
		name, value, _ := bytes.Cut(line[:len(line)-2], []byte(":"))
		value = bytes.Trim(value, " \t")
		switch {
		case h1.EqualFold(name, "transfer-encoding"):
			continue
		case h1.EqualFold(name, "expect") && h1.EqualFold(value, "100-continue"):
			expect = true
			continue
		}
		dst = append(dst, line...)
	}
	return dst, expect
}

// unread is what the read-ahead buffer holds that no one has read.
func (c *prefetchConn) unread() []byte {
	if c.buf == nil {
		return nil
	}
	return (*c.buf)[c.r:c.w]
}

// fill reads the socket once into the read-ahead buffer, after what it
// holds: a head is read whole before anyone reads a byte of it. The
// buffer grows, past prefetchSize, up to a head's bound.
func (c *prefetchConn) fill() error {
	if c.buf == nil {
		c.buf, c.r, c.w = prefetchBufs.Get().(*[]byte), 0, 0
	}
	b := *c.buf
	if c.w == len(b) {
		switch {
		case c.r > 0:
			c.w = copy(b, b[c.r:c.w])
			c.r = 0
		default:
			nb := make([]byte, max(2*len(b), c.door.lim.MaxHead+prefetchSize))
			copy(nb, b)
			c.putBuf()
			c.buf = &nb
			b = nb
		}
	}
	n, err := c.readConn(b[c.w:])
	c.w += n
	if n > 0 {
		return nil // an error that came with bytes comes again at the next read
	}
	if err == nil {
		err = errNothingRead
	}
	return err
}

var errNothingRead = errors.New("proxy: a read of the client's socket gave nothing")

// releaseDrained gives back the read-ahead buffer once nothing in it is
// left to read.
func (c *prefetchConn) releaseDrained() {
	if c.buf != nil && c.r == c.w {
		c.putBuf()
		c.buf = nil
	}
}

// putBuf returns the read-ahead buffer to its pool, when it is one of the
// pool's size: one grown for a large head is left to the collector.
func (c *prefetchConn) putBuf() {
	if len(*c.buf) == prefetchSize {
		prefetchBufs.Put(c.buf)
	}
}
