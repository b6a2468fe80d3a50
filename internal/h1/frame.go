// Package h1 finds where HTTP/1.1 messages end in a byte stream, for a
// relay that passes the bytes on untouched: it reads the framing (the
// status line, Content-Length, Transfer-Encoding: chunked) and nothing
// else, and copies no bytes but those of a line split between reads.
//
// It is strict where a laxer reading could put a message's end somewhere
// other than where the client behind the relay puts it — a lone CR or LF
// as a line end, a folded or space-broken field line, Content-Length
// beside Transfer-Encoding, a repeated length — because a relay that
// ends a response early or late desynchronises every exchange after it
// on that connection. Such messages are refused (ErrFraming), never
// guessed at; so are those a keep-alive relay cannot carry at all: a body
// that runs to the connection's close, and 101 Switching Protocols.
//
// Head reads the fields of a response head it has accepted, for a relay
// that passes on a head with a few fields changed.
package h1

import (
	"bytes"
	"errors"
	"fmt"
	"math"
)

// DefaultMaxHead bounds a head (a status or request line and its fields)
// and a trailer section, in bytes, where no other bound is given.
const DefaultMaxHead = 64 << 10

// ErrFraming says a message's end cannot be found with certainty, or its
// body would run to the connection's close: the connection cannot carry
// another exchange. Every error from this package wraps it.
var ErrFraming = errors.New("h1: unsupported or broken HTTP/1.1 framing")

// ErrToClose says a response is well formed but ends only where its
// connection closes — an HTTP/1.0 status line, or no length at all — so
// that a relay may read it to the close instead of refusing it. It wraps
// ErrFraming.
var ErrToClose = fmt.Errorf("%w: a response that ends where its connection closes", ErrFraming)

// Why a message was refused, each wrapping ErrFraming: for logs, and for
// the tests, which hold the refusals that go beyond what fasthttp refuses
// to a known list.
var (
	errHeadTooLong      = wrap("head or trailer section over the size limit")
	errStatusLine       = wrap("not an HTTP/1.1 status line")
	errLineEnd          = wrap("a line not ended by CRLF, or a CR inside one")
	errObsFold          = wrap("a folded field line")
	errFieldName        = wrap("a field line without a valid name and colon")
	errLength           = wrap("a repeated or malformed Content-Length")
	errTransferEncoding = wrap("a repeated Transfer-Encoding, or one other than chunked")
	errBothLengths      = wrap("both Content-Length and Transfer-Encoding")
	errNoLength         = fmt.Errorf("%w: neither Content-Length nor chunked: a body to the close", ErrToClose)
	errHTTP10           = fmt.Errorf("%w: an HTTP/1.0 response", ErrToClose)
	errUpgrade          = wrap("101 Switching Protocols")
	errChunk            = wrap("a malformed chunk")
)

func wrap(why string) error { return fmt.Errorf("%w: %s", ErrFraming, why) }

// RequestLen is the length of the request at the start of b once its
// head is complete — head plus Content-Length, which is more than len(b)
// while the body is still coming; 0 while the head is incomplete; -1 for
// a request a Content-Length relay cannot carry: a body framed by
// Transfer-Encoding, a malformed field line or length, or a head over
// maxHead bytes (maxHead <= 0 means DefaultMaxHead). The request line
// itself is not checked: the upstream judges it.
func RequestLen(b []byte, maxHead int) int {
	if maxHead <= 0 {
		maxHead = DefaultMaxHead
	}
	i := bytes.Index(b, []byte("\r\n\r\n"))
	if i < 0 {
		if len(b) > maxHead {
			return -1
		}
		return 0
	}
	if i+4 > maxHead {
		return -1
	}
	head := b[:i+2] // every line with its CRLF
	head = head[bytes.IndexByte(head, '\n')+1:]
	var f fields
	for len(head) > 0 {
		j := bytes.IndexByte(head, '\n')
		l, err := lineBody(head[:j+1])
		if err == nil {
			err = f.take(l)
		}
		if err != nil {
			return -1
		}
		head = head[j+1:]
	}
	if f.te || f.length > int64(math.MaxInt-(i+4)) {
		return -1
	}
	return i + 4 + int(f.length) // may be past len(b): the body is still coming
}

// ResponseEnd follows one response through the bytes an upstream sends,
// read by read, to find where it ends; a relay knows then that the
// connection is free for the next request, and, from what a read held
// past that end, whether the upstream sent more than it was asked for.
// Its zero value expects a new response with heads of up to
// DefaultMaxHead bytes; Reset makes it expect the next one. It copies
// nothing while each head and trailer line arrives within one read, so a
// response fed whole costs no allocation.
//
// It has no notion of the request: a response to HEAD, whose head
// announces a body that never comes, must not be fed to it.
type ResponseEnd struct {
	// MaxHead bounds each head (status line and fields) and the trailer
	// section, in bytes, so that an upstream cannot keep a relay reading
	// (and holding a line of) a head without end. 0 means DefaultMaxHead.
	MaxHead int

	state   uint8
	err     error  // the refusal, kept: the stream cannot be followed past it
	line    []byte // a head or trailer line begun in an earlier Feed
	headLen int    // bytes of the current head or trailer section so far
	status  int
	f       fields // what the current head says of the body
	// the chunk-size line so far
	digits   uint8
	ows, ext bool
}

const (
	stStatus  uint8 = iota // awaiting a status line
	stField                // in the head's field lines
	stBody                 // f.length bytes of a Content-Length body to come
	stSize                 // in a chunk-size line
	stSizeLF               // the chunk-size line's CR seen: its LF must follow
	stData                 // f.length bytes of chunk data to come
	stDataCR               // the CR after chunk data to come
	stDataLF               // the LF after chunk data to come
	stTrailer              // in the trailer section
	stDone
	stFailed
)

// maxChunkDigits bounds a chunk size's hex digits so that it cannot
// overflow; fasthttp refuses more too.
const maxChunkDigits = 15

// Reset readies r for the next response, keeping MaxHead and the memory
// it held lines in.
func (r *ResponseEnd) Reset() {
	*r = ResponseEnd{MaxHead: r.MaxHead, line: r.line[:0]}
}

// Feed takes the next bytes the upstream sent. n is how many of them
// belong to the response: all of b until done, when b[n:] is what came
// past the response's end — nothing, on a connection that is to carry
// another exchange. Once done, Feed takes nothing more (0, true, nil)
// until Reset. An error (wrapping ErrFraming) is for good: n is 0 and the
// stream cannot be followed further, now or in later Feeds.
//
// Interim (1xx) responses before the final one are part of it: Feed is
// done at the final response's end. 204 and 304 responses end with their
// head.
func (r *ResponseEnd) Feed(b []byte) (n int, done bool, err error) {
	if r.err != nil {
		return 0, false, r.err
	}
	for n < len(b) {
		switch r.state {
		case stStatus, stField, stTrailer:
			k, err := r.lines(b[n:])
			n += k
			if err != nil {
				return r.fail(err)
			}
		case stBody, stData:
			k := int(min(r.f.length, int64(len(b)-n)))
			r.f.length -= int64(k)
			n += k
			if r.f.length == 0 {
				if r.state == stBody {
					r.state = stDone
				} else {
					r.state = stDataCR
				}
			}
		case stDataCR:
			if b[n] != '\r' {
				return r.fail(errChunk)
			}
			n++
			r.state = stDataLF
		case stDataLF:
			if b[n] != '\n' {
				return r.fail(errChunk)
			}
			n++
			r.state, r.digits, r.ows, r.ext = stSize, 0, false, false
		case stSize:
			if err := r.sizeByte(b[n]); err != nil {
				return r.fail(err)
			}
			n++
		case stSizeLF:
			if b[n] != '\n' {
				return r.fail(errChunk)
			}
			n++
			if r.f.length > 0 {
				r.state = stData
			} else {
				r.state, r.headLen = stTrailer, 0 // the last chunk
			}
		case stDone:
			return n, true, nil
		}
	}
	return n, r.state == stDone, nil
}

func (r *ResponseEnd) fail(err error) (int, bool, error) {
	r.state, r.err = stFailed, err
	return 0, false, err
}

// sizeByte takes one byte of a chunk-size line: hex digits, optional
// whitespace, an optional extension (skipped, up to the line's CR). The
// grammar is fasthttp's, a little narrower than RFC 9112's (no whitespace
// before ';'); no server this relays for sends extensions at all.
func (r *ResponseEnd) sizeByte(c byte) error {
	switch {
	case r.ext && c != '\r':
		if c == '\n' { // a line end to some readers: a way to smuggle
			return errChunk
		}
	case c == '\r':
		if r.digits == 0 {
			return errChunk
		}
		r.state = stSizeLF
	case !r.ows && isHex(c):
		if r.digits == maxChunkDigits {
			return errChunk
		}
		r.f.length = r.f.length<<4 | int64(hexVal(c))
		r.digits++
	case r.digits == 0:
		return errChunk
	case c == ' ' || c == '\t':
		r.ows = true
	case c == ';' && !r.ows:
		r.ext = true
	default:
		return errChunk
	}
	return nil
}

// lines takes head or trailer lines from b while the state is one of
// theirs; k is the bytes taken. A line that b ends in the middle of is
// kept in r.line until a later Feed completes it; a complete one is read
// where it lies.
func (r *ResponseEnd) lines(b []byte) (k int, err error) {
	maxHead := r.MaxHead
	if maxHead <= 0 {
		maxHead = DefaultMaxHead
	}
	for k < len(b) && (r.state == stStatus || r.state == stField || r.state == stTrailer) {
		i := bytes.IndexByte(b[k:], '\n')
		if i < 0 {
			if r.headLen += len(b) - k; r.headLen > maxHead {
				return k, errHeadTooLong
			}
			r.line = append(r.line, b[k:]...)
			return len(b), nil
		}
		l := b[k : k+i+1]
		k += i + 1
		if r.headLen += i + 1; r.headLen > maxHead {
			return k, errHeadTooLong
		}
		if len(r.line) > 0 {
			r.line = append(r.line, l...)
			l = r.line
		}
		err = r.takeLine(l)
		r.line = r.line[:0]
		if err != nil {
			return k, err
		}
	}
	return k, nil
}

// takeLine takes one complete head or trailer line, LF included.
func (r *ResponseEnd) takeLine(l []byte) error {
	l, err := lineBody(l)
	if err != nil {
		return err
	}
	switch {
	case r.state == stStatus:
		return r.statusLine(l)
	case len(l) == 0 && r.state == stField:
		return r.headEnd()
	case len(l) == 0: // the trailer section's end
		r.state = stDone
		return nil
	case r.state == stField:
		return r.f.take(l)
	}
	_, _, err = splitField(l) // a trailer: its name matters to no framing
	return err
}

// statusLine reads "HTTP/1.1 NNN[ reason]". Other versions are refused:
// an HTTP/1.0 response is not kept alive by default and its
// Transfer-Encoding is not to be trusted, and upstreams speak 1.1.
func (r *ResponseEnd) statusLine(l []byte) error {
	status, ok := status11(l)
	if !ok {
		if len(l) >= 12 && string(l[:9]) == "HTTP/1.0 " && isDigits(l[9:12]) && (len(l) == 12 || l[12] == ' ') {
			return errHTTP10
		}
		return errStatusLine
	}
	r.status, r.state = status, stField
	return nil
}

// status11 is the status code of an "HTTP/1.1 NNN[ reason]" line (CRLF
// removed); ok is false for any other line.
func status11(l []byte) (status int, ok bool) {
	if len(l) < 12 || string(l[:9]) != "HTTP/1.1 " || len(l) > 12 && l[12] != ' ' || !isDigits(l[9:12]) {
		return 0, false
	}
	return int(l[9]-'0')*100 + int(l[10]-'0')*10 + int(l[11]-'0'), true
}

// headEnd decides, at a head's empty line, what follows it.
func (r *ResponseEnd) headEnd() error {
	if r.f.cl && r.f.te {
		// RFC 9112 §6.3: Transfer-Encoding wins, and a relay must drop
		// Content-Length before passing the message on — which a relay of
		// untouched bytes cannot, leaving the client to choose.
		return errBothLengths
	}
	switch s := r.status; {
	case s == 101:
		return errUpgrade // what follows is no longer HTTP
	case s >= 100 && s < 200: // interim: the final response's head follows
		r.state, r.headLen, r.f = stStatus, 0, fields{}
	case s == 204 || s == 304:
		r.state = stDone
	case r.f.te:
		r.state, r.f.length, r.digits, r.ows, r.ext = stSize, 0, 0, false, false
	case r.f.cl && r.f.length == 0:
		r.state = stDone
	case r.f.cl:
		r.state = stBody
	default:
		return errNoLength
	}
	return nil
}

// fields is what a head's field lines say of its body's framing.
type fields struct {
	length int64 // Content-Length, once cl; then the body or chunk bytes to come
	cl, te bool  // Content-Length seen; Transfer-Encoding: chunked seen
}

// take reads one field line, CRLF removed.
func (f *fields) take(l []byte) error {
	name, value, err := splitField(l)
	if err != nil {
		return err
	}
	switch {
	case equalFold(name, "content-length"):
		if f.cl {
			return errLength // even if equal: fasthttp refuses it too
		}
		n, ok := parseLength(value)
		if !ok {
			return errLength
		}
		f.cl, f.length = true, n
	case equalFold(name, "transfer-encoding"):
		// A list ("gzip, chunked"), or chunked applied twice, has no
		// upstream this relays for; fasthttp refuses them too.
		if f.te || !equalFold(value, "chunked") {
			return errTransferEncoding
		}
		f.te = true
	}
	return nil
}
