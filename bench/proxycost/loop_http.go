package proxycost

import (
	"bytes"
	"errors"
	"strconv"
)

// The framing ServeLoop needs and no more: where a request ends, and
// where a response ends. Headers are matched case-insensitively; anything
// else in them passes through untouched.

var (
	errFraming     = errors.New("epoll-bare: unsupported or broken HTTP framing")
	headerEnd      = []byte("\r\n\r\n")
	contentLength  = []byte("content-length:")
	chunkedHeader  = []byte("transfer-encoding: chunked")
	maxRequestHead = 64 << 10
)

// requestLen is the length of the request at the start of b, once its
// head is complete (more than len(b) while its body is not); 0 while the
// head is incomplete, -1 for one ServeLoop does not relay (a chunked request
// body, or a head over 64 KiB).
func requestLen(b []byte) int {
	i := bytes.Index(b, headerEnd)
	if i < 0 {
		if len(b) > maxRequestHead {
			return -1
		}
		return 0
	}
	head := b[:i+2]
	if hasHeader(head, chunkedHeader) {
		return -1
	}
	n, ok := headerInt(head, contentLength)
	if !ok {
		n = 0
	}
	if n < 0 {
		return -1
	}
	return i + 4 + n // may be past len(b): the body is still coming
}

// hasHeader reports whether a line of head starts with h (lower case),
// ignoring case.
func hasHeader(head, h []byte) bool {
	_, ok := headerLine(head, h)
	return ok
}

// headerLine is the rest of head's line that starts with h, ignoring case.
func headerLine(head, h []byte) ([]byte, bool) {
	for len(head) > 0 {
		j := bytes.IndexByte(head, '\n')
		if j < 0 {
			return nil, false
		}
		line := head[:j]
		if len(line) >= len(h) && bytes.EqualFold(line[:len(h)], h) {
			return bytes.TrimSpace(line[len(h):]), true
		}
		head = head[j+1:]
	}
	return nil, false
}

func headerInt(head, h []byte) (int, bool) {
	v, ok := headerLine(head, h)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(string(v))
	if err != nil {
		return -1, true
	}
	return n, true
}

// respEnd follows one response through the bytes an upstream sends, to
// find where it ends. Its zero value expects a new response; reset makes
// it expect the next one.
type respEnd struct {
	state  uint8
	head   []byte // the header bytes while they are incomplete
	remain int    // body or chunk bytes still to come
	line   int    // bytes seen on the current chunk-size or trailer line
}

// reset readies r for the next response, keeping its head buffer.
func (r *respEnd) reset() { *r = respEnd{head: r.head[:0]} }

const (
	rsHead uint8 = iota
	rsBody
	rsChunkSize
	rsChunkData
	rsChunkCRLF
	rsTrailer
	rsDone
)

// feed takes the next bytes of the response; done when they end it.
func (r *respEnd) feed(b []byte) (done bool, err error) {
	for len(b) > 0 {
		switch r.state {
		case rsHead:
			// The head is looked for in b itself while nothing is held
			// (a head arrives in one read): no copy, no allocation.
			head := b
			if len(r.head) > 0 {
				r.head = append(r.head, b...)
				head = r.head
			}
			i := bytes.Index(head, headerEnd)
			if i < 0 {
				if len(head) > maxRequestHead {
					return false, errFraming
				}
				if len(r.head) == 0 {
					r.head = append(r.head, b...)
				}
				return false, nil
			}
			b = b[len(b)-(len(head)-(i+4)):]
			head = head[:i+2]
			switch n, ok := headerInt(head, contentLength); {
			case hasHeader(head, chunkedHeader):
				r.state, r.remain, r.line = rsChunkSize, 0, 0
			case ok && n >= 0:
				r.state, r.remain = rsBody, n
			default:
				return false, errFraming // a body to the close: not kept alive
			}
			r.head = r.head[:0]
			if r.state == rsBody && r.remain == 0 {
				r.state = rsDone
			}
		case rsBody, rsChunkData:
			n := min(r.remain, len(b))
			r.remain -= n
			b = b[n:]
			if r.remain == 0 {
				if r.state == rsBody {
					r.state = rsDone
				} else {
					r.state, r.remain = rsChunkCRLF, 2
				}
			}
		case rsChunkCRLF:
			n := min(r.remain, len(b))
			r.remain -= n
			b = b[n:]
			if r.remain == 0 {
				r.state, r.line = rsChunkSize, 0
			}
		case rsChunkSize:
			c := b[0]
			b = b[1:]
			switch {
			case c == '\n':
				if r.remain == 0 {
					r.state, r.line = rsTrailer, 0
				} else {
					r.state = rsChunkData
				}
			case r.line >= 0 && isHex(c):
				r.remain = r.remain<<4 | hexVal(c)
				if r.remain > 1<<30 {
					return false, errFraming
				}
			case c == ';' || c == '\r' || c == ' ':
				r.line = -1 // an extension or the line's end: no more digits
			}
		case rsTrailer:
			c := b[0]
			b = b[1:]
			if c == '\n' {
				if r.line == 0 {
					r.state = rsDone
				}
				r.line = 0
			} else if c != '\r' {
				r.line++
			}
		case rsDone:
			return true, nil
		}
	}
	return r.state == rsDone, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func hexVal(c byte) int {
	switch {
	case c <= '9':
		return int(c - '0')
	case c >= 'a':
		return int(c-'a') + 10
	}
	return int(c-'A') + 10
}
