package h1

import "math"

// MaxChunkExt bounds a chunk-size line's extensions, in bytes: no client
// or engine the router serves sends any, and a reader that skips them
// without bound can be kept reading one line for good.
const MaxChunkExt = 1 << 10

// Chunked takes the chunked transfer coding (RFC 9112 §7.1) off a body,
// in pieces as they arrive. It is the router's one reader of chunked
// framing: a request's body at the front door, where a response ends
// (ResponseEnd), and a streamed response's data (the stream loops).
//
// The grammar is fasthttp's, a little narrower than RFC 9112's: a chunk
// size of at most 15 hex digits, whitespace after it only where no
// extension follows; an extension up to MaxChunkExt bytes without
// control characters but HTAB; trailer field lines as a head's (a token
// name, a colon, a value without control characters but HTAB, CRLF), the
// whole trailer section up to MaxTrailer bytes. Its zero value expects
// the first chunk-size line, with trailers up to DefaultMaxHead bytes.
type Chunked struct {
	// MaxTrailer bounds the trailer section, in bytes; 0 means
	// DefaultMaxHead.
	MaxTrailer int

	state  uint8
	err    error // the refusal, kept: the body cannot be followed past it
	left   int64 // data bytes of the current chunk to come
	digits uint8 // hex digits of the chunk-size line so far
	ows    bool  // whitespace after them
	ext    bool  // in an extension
	n      int   // bytes of the extension, or of the trailer section, so far
}

const (
	ckSize       uint8 = iota // in a chunk-size line
	ckSizeLF                  // its CR seen: its LF must follow
	ckData                    // left bytes of chunk data to come
	ckDataCR                  // the CR after the data
	ckDataLF                  // the LF after the data
	ckFieldStart              // at a trailer line's start
	ckFieldName               // in a trailer field's name
	ckFieldValue              // in its value
	ckFieldLF                 // its CR seen
	ckEndLF                   // the trailer section's empty line's CR seen
	ckDone
	ckFailed
)

var (
	errChunkExt  = wrap("a chunk extension too long or with a control character")
	errFieldText = wrap("a control character in a trailer field's value")
)

// Reset readies d for another body, keeping MaxTrailer.
func (d *Chunked) Reset() { *d = Chunked{MaxTrailer: d.MaxTrailer} }

// Done reports that the last chunk and the trailer section are read.
func (d *Chunked) Done() bool { return d.state == ckDone }

// Next reads src, the body's next bytes, through the next run of chunk
// data, of which it takes at most max bytes, and returns that run (a
// part of src, not copied: nil where src held none) and used, the bytes
// of src taken, framing and data. It takes no byte past the body's end
// (Done). An error, wrapping ErrFraming, is for good: the body cannot be
// followed past it, now or in later calls.
func (d *Chunked) Next(src []byte, max int) (data []byte, used int, err error) {
	if d.err != nil {
		return nil, 0, d.err
	}
	for used < len(src) {
		switch d.state {
		case ckData:
			k := int(min(d.left, int64(len(src)-used), int64(max)))
			if k <= 0 {
				return nil, used, nil // no room for it
			}
			data = src[used : used+k]
			used += k
			if d.left -= int64(k); d.left == 0 {
				d.state = ckDataCR
			}
			return data, used, nil
		case ckDone:
			return nil, used, nil
		}
		if err := d.step(src[used]); err != nil {
			d.state, d.err = ckFailed, err
			return nil, used, err
		}
		used++
	}
	return nil, used, nil
}

// Decode takes the framing off src and copies the data it carries into
// dst, as far as dst has room: n data bytes written, used bytes of src
// taken. It stops at the body's end (Done) and takes no byte after it.
// Errors are Next's.
func (d *Chunked) Decode(dst, src []byte) (n, used int, err error) {
	for used < len(src) && d.state != ckDone {
		data, k, err := d.Next(src[used:], len(dst)-n)
		used += k
		n += copy(dst[n:], data)
		if err != nil || k == 0 {
			return n, used, err
		}
	}
	return n, used, nil
}

// Skip is Next for a reader that wants none of the data (ResponseEnd):
// the bytes of src taken, to the body's end at most.
func (d *Chunked) Skip(src []byte) (used int, err error) {
	for used < len(src) && d.state != ckDone {
		_, k, err := d.Next(src[used:], math.MaxInt)
		used += k
		if err != nil {
			return used, err
		}
	}
	return used, nil
}

// step takes one framing byte.
func (d *Chunked) step(c byte) error {
	switch d.state {
	case ckSize:
		return d.sizeByte(c)
	case ckSizeLF:
		if c != '\n' {
			return errChunk
		}
		if d.left > 0 {
			d.state = ckData
		} else {
			d.state, d.n = ckFieldStart, 0 // the last chunk
		}
	case ckDataCR:
		if c != '\r' {
			return errChunk // data longer than its size
		}
		d.state = ckDataLF
	case ckDataLF:
		if c != '\n' {
			return errChunk
		}
		d.state, d.digits, d.ows, d.ext, d.n = ckSize, 0, false, false, 0
	default:
		return d.trailerByte(c)
	}
	return nil
}

// sizeByte takes one byte of a chunk-size line: hex digits, optional
// whitespace, or an extension (read to the line's CR, not parsed).
func (d *Chunked) sizeByte(c byte) error {
	switch {
	case d.ext && c != '\r':
		if c == '\n' { // a line end to some readers: a way to smuggle
			return errChunk
		}
		if d.n++; d.n > MaxChunkExt || class[c]&cValue == 0 {
			return errChunkExt
		}
	case c == '\r':
		if d.digits == 0 {
			return errChunk
		}
		d.state = ckSizeLF
	case !d.ows && isHex(c):
		if d.digits == maxChunkDigits {
			return errChunk
		}
		d.left = d.left<<4 | int64(hexVal(c))
		d.digits++
	case d.digits == 0:
		return errChunk
	case c == ' ' || c == '\t':
		d.ows = true
	case c == ';' && !d.ows:
		d.ext = true
	default:
		return errChunk
	}
	return nil
}

// trailerByte takes one byte of the trailer section: field lines, each
// checked as a head's is (none is acted on), then an empty line.
func (d *Chunked) trailerByte(c byte) error {
	maxTrailer := d.MaxTrailer
	if maxTrailer <= 0 {
		maxTrailer = DefaultMaxHead
	}
	if d.n++; d.n > maxTrailer {
		return errHeadTooLong
	}
	switch d.state {
	case ckFieldStart:
		switch {
		case c == '\r':
			d.state = ckEndLF
		case c == '\n':
			return errLineEnd
		case c == ' ' || c == '\t':
			return errObsFold
		case class[c]&cToken != 0:
			d.state = ckFieldName
		default:
			return errFieldName
		}
	case ckFieldName:
		switch {
		case c == ':':
			d.state = ckFieldValue
		case class[c]&cToken == 0:
			return errFieldName
		}
	case ckFieldValue:
		switch {
		case c == '\r':
			d.state = ckFieldLF
		case c == '\n':
			return errLineEnd
		case class[c]&cValue == 0:
			return errFieldText
		}
	case ckFieldLF, ckEndLF:
		if c != '\n' {
			return errLineEnd
		}
		if d.state == ckEndLF {
			d.state = ckDone
		} else {
			d.state = ckFieldStart
		}
	}
	return nil
}
