// Package h1 reads HTTP/1.1 framing for the router, strictly, in one
// place:
//
//   - ParseRequest is the grammar every request passes before anything
//     acts on it, whichever path serves it (RFC 9112's request head, in
//     one pass, without allocation): a request that breaks it is refused
//     with the status its error says, and its connection closed;
//   - Chunked is the one reader of chunked bodies: a request's, which the
//     front door decodes, and a response's;
//   - ResponseEnd finds where a response ends in an upstream's byte
//     stream, for a relay that passes the bytes on untouched, and Head
//     reads the fields of a response head it has accepted, for a relay
//     that passes on a head with a few fields changed.
//
// It is strict where a laxer reading could put a message's end somewhere
// other than where the reader behind the relay puts it — a lone CR or LF
// as a line end, a folded or space-broken field line, Content-Length
// beside Transfer-Encoding, a repeated length — because a relay that
// ends a message early or late desynchronises every exchange after it
// on that connection, and lets a request hide in another's bytes. Such
// messages are refused, never guessed at; so are the responses a
// keep-alive relay cannot carry at all: a body that runs to the
// connection's close, and 101 Switching Protocols. It copies no bytes
// but those of a response line split between reads.
package h1

import (
	"bytes"
	"errors"
	"fmt"
)

// DefaultMaxHead bounds a head (a status or request line and its fields)
// and a trailer section, in bytes, where no other bound is given.
const DefaultMaxHead = 64 << 10

// ErrFraming says a message's end cannot be found with certainty, or its
// body would run to the connection's close: the connection cannot carry
// another exchange. Every error of ResponseEnd and Chunked wraps it; a
// request's refusals wrap ErrMalformed and the others ParseRequest
// names.
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
	f       fields  // what the current head says of the body
	chunks  Chunked // a chunked body's progress
}

const (
	stStatus uint8 = iota // awaiting a status line
	stField               // in the head's field lines
	stBody                // f.length bytes of a Content-Length body to come
	stChunks              // in a chunked body, its trailer section included
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

// maxHead is MaxHead with its default.
func (r *ResponseEnd) maxHead() int {
	if r.MaxHead <= 0 {
		return DefaultMaxHead
	}
	return r.MaxHead
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
		case stStatus, stField:
			k, err := r.lines(b[n:])
			n += k
			if err != nil {
				return r.fail(err)
			}
		case stBody:
			k := int(min(r.f.length, int64(len(b)-n)))
			r.f.length -= int64(k)
			n += k
			if r.f.length == 0 {
				r.state = stDone
			}
		case stChunks:
			k, err := r.chunks.Skip(b[n:])
			n += k
			if err != nil {
				return r.fail(err)
			}
			if r.chunks.Done() {
				r.state = stDone
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

// lines takes head lines from b while the state is one of theirs; k is
// the bytes taken. A line that b ends in the middle of is
// kept in r.line until a later Feed completes it; a complete one is read
// where it lies.
func (r *ResponseEnd) lines(b []byte) (k int, err error) {
	maxHead := r.maxHead()
	for k < len(b) && (r.state == stStatus || r.state == stField) {
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

// takeLine takes one complete head line, LF included.
func (r *ResponseEnd) takeLine(l []byte) error {
	l, err := lineBody(l)
	switch {
	case err != nil:
		return err
	case r.state == stStatus:
		return r.statusLine(l)
	case len(l) == 0:
		return r.headEnd()
	}
	return r.f.take(l)
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
		r.state, r.chunks = stChunks, Chunked{MaxTrailer: r.maxHead()}
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
