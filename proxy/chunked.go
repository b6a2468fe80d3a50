package proxy

import (
	"errors"
	"fmt"
)

// errChunked is an upstream body whose chunked framing is broken.
var errChunked = fmt.Errorf("%w: malformed chunked framing", ErrUpstream)

// chunkDecoder takes HTTP/1.1 chunked framing (RFC 9112 §7.1) off a
// response body, in pieces as they arrive: a stream taken from fasthttp
// after its head (pump_linux.go) is read off its socket by the router
// itself. Chunk extensions are skipped, trailer fields read and dropped.
// The zero value expects the first chunk's size line.
type chunkDecoder struct {
	state  chunkState
	left   uint64 // data bytes of the current chunk not yet taken
	digits int    // hex digits of the size line seen
	line   int    // bytes of the trailer line being read (0: a blank line so far)
}

type chunkState uint8

const (
	chunkSize      chunkState = iota // the size line's hex digits
	chunkExt                         // after the digits: an extension, or the line's CR
	chunkSizeLF                      // the size line's LF
	chunkData                        // left bytes of data
	chunkDataCR                      // the CR after the data
	chunkDataLF                      // the LF after the data
	chunkTrailer                     // after the last chunk: trailer lines up to a blank one
	chunkTrailerLF                   // a trailer line's LF
	chunkDone                        // the body is over
)

// maxChunkSizeDigits bounds a size line: sixteen hex digits fill a uint64.
const maxChunkSizeDigits = 16

// done reports that the last chunk and its trailer have been read.
func (d *chunkDecoder) done() bool { return d.state == chunkDone }

// decode takes framing off src and copies the data it carries into dst,
// as far as dst has room. It returns the data bytes written to dst and
// the src bytes used; it stops at the end of the body (done) and uses no
// byte after it. The error is errChunked for framing that is not HTTP/1.1
// chunked encoding.
func (d *chunkDecoder) decode(dst, src []byte) (n, used int, err error) {
	for used < len(src) && d.state != chunkDone {
		if d.state == chunkData {
			k := min(uint64(len(dst)-n), uint64(len(src)-used), d.left)
			if k == 0 {
				return n, used, nil // dst is full
			}
			copy(dst[n:], src[used:used+int(k)])
			n += int(k)
			used += int(k)
			if d.left -= k; d.left == 0 {
				d.state = chunkDataCR
			}
			continue
		}
		c := src[used]
		used++
		if err := d.step(c); err != nil {
			return n, used, err
		}
	}
	return n, used, nil
}

// step moves the decoder through one framing byte.
func (d *chunkDecoder) step(c byte) error {
	switch d.state {
	case chunkSize:
		v, ok := hexDigit(c)
		switch {
		case ok:
			if d.digits == maxChunkSizeDigits {
				return fmt.Errorf("%w: chunk size over %d hex digits", errChunked, maxChunkSizeDigits)
			}
			d.left = d.left<<4 | uint64(v)
			d.digits++
		case d.digits == 0:
			return fmt.Errorf("%w: chunk size expected, got %q", errChunked, c)
		case c == '\r':
			d.state = chunkSizeLF
		case c == ';' || c == ' ' || c == '\t':
			d.state = chunkExt
		default:
			return fmt.Errorf("%w: %q in a chunk size", errChunked, c)
		}
	case chunkExt:
		if c == '\r' {
			d.state = chunkSizeLF
		} else if c == '\n' {
			return errors.Join(errChunked, errors.New("bare LF in a chunk size line"))
		}
	case chunkSizeLF:
		if c != '\n' {
			return fmt.Errorf("%w: CR without LF after a chunk size", errChunked)
		}
		d.digits = 0
		if d.left == 0 {
			d.state, d.line = chunkTrailer, 0
		} else {
			d.state = chunkData
		}
	case chunkDataCR:
		if c != '\r' {
			return fmt.Errorf("%w: chunk data longer than its size", errChunked)
		}
		d.state = chunkDataLF
	case chunkDataLF:
		if c != '\n' {
			return fmt.Errorf("%w: CR without LF after chunk data", errChunked)
		}
		d.state = chunkSize
	case chunkTrailer:
		if c == '\r' {
			d.state = chunkTrailerLF
		} else {
			d.line++
		}
	case chunkTrailerLF:
		if c != '\n' {
			return fmt.Errorf("%w: CR without LF in the trailer", errChunked)
		}
		if d.line == 0 {
			d.state = chunkDone
		} else {
			d.state, d.line = chunkTrailer, 0
		}
	}
	return nil
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
