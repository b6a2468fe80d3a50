package kvevents

import (
	"bytes"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// reader walks one payload with msgpack.Decoder's low-level calls. The
// library parses every header and number; reader adds what a decoder of
// hostile input needs and the library leaves to its caller:
//
//   - The type of the next value is checked (PeekCode) before it is read:
//     DecodeInt64, DecodeUint64 and DecodeFloat64 read nil as 0,
//     DecodeArrayLen and DecodeMapLen read nil as -1, and DecodeMapLen
//     steps over an ext header before a map. None of those is a batch.
//   - A length read off the wire is checked against the bytes left before
//     anything is done with it, and str and bin bodies are sliced from the
//     payload (aliasing it) rather than read: DecodeBytes allocates the
//     header's length up front (4 GiB for a five-byte header), DecodeString
//     up to 1 MiB, and both copy.
//   - Skipping is depth-bounded (skipValue): Decoder.Skip recurses once per
//     level of nesting with no limit, so a payload of n bytes 0x91 grows
//     the goroutine's stack by a frame per byte — 250 MB for a 1 MB
//     payload, and a fatal, unrecoverable stack overflow for ~12 MB.
//     Skip is used for scalars only.
//   - Errors are sticky: the first failure sets err to ErrMalformed and
//     every later call returns zero values, so callers check err once.
type reader struct {
	br      bytes.Reader // the Decoder reads it directly (it's an io.ByteScanner): no buffering
	dec     *msgpack.Decoder
	payload []byte
	err     error
	// depth bounds nesting in skipValue.
	depth int
}

// maxDepth bounds nesting while skipping unknown values.
const maxDepth = 32

func (r *reader) fail() {
	if r.err == nil {
		r.err = ErrMalformed
	}
}

// ok records a library error as ErrMalformed and reports whether the
// reader is still good.
func (r *reader) ok(err error) bool {
	if err != nil {
		r.fail()
	}
	return r.err == nil
}

// off is the offset of the next unread byte.
func (r *reader) off() int { return len(r.payload) - r.br.Len() }

// take consumes the next n bytes and returns them, aliasing the payload.
func (r *reader) take(n int) []byte {
	if r.err != nil || n < 0 || n > r.br.Len() {
		r.fail()
		return nil
	}
	start := r.off()
	if _, err := r.br.Seek(int64(n), io.SeekCurrent); !r.ok(err) {
		return nil
	}
	return r.payload[start : start+n : start+n]
}

// kind of the next value, without consuming it.
type mpKind uint8

const (
	mpOther mpKind = iota // bool, or the unused code 0xc1
	mpNil
	mpInt
	mpFloat
	mpStr
	mpBin
	mpArray
	mpMap
	mpExt
)

func (r *reader) kind() mpKind {
	if r.err != nil {
		return mpOther
	}
	c, err := r.dec.PeekCode()
	if !r.ok(err) {
		return mpOther
	}
	switch {
	case msgpcode.IsFixedNum(c), c >= msgpcode.Uint8 && c <= msgpcode.Int64:
		return mpInt
	case msgpcode.IsString(c):
		return mpStr
	case msgpcode.IsFixedArray(c), c == msgpcode.Array16, c == msgpcode.Array32:
		return mpArray
	case msgpcode.IsFixedMap(c), c == msgpcode.Map16, c == msgpcode.Map32:
		return mpMap
	case c == msgpcode.Nil:
		return mpNil
	case c == msgpcode.Float, c == msgpcode.Double:
		return mpFloat
	case msgpcode.IsBin(c):
		return mpBin
	case msgpcode.IsExt(c):
		return mpExt
	}
	return mpOther
}

// isNil consumes a nil if one is next.
func (r *reader) isNil() bool {
	if r.kind() != mpNil {
		return false
	}
	return r.ok(r.dec.DecodeNil())
}

// int reads any integer as its 64-bit pattern; neg reports a negative
// signed value (so a caller can tell int64(-1) from uint64(2^64−1)).
func (r *reader) int() (v uint64, neg bool) {
	if r.kind() != mpInt {
		r.fail()
		return 0, false
	}
	if c, _ := r.dec.PeekCode(); c == msgpcode.Uint64 {
		v, err := r.dec.DecodeUint64()
		if !r.ok(err) {
			return 0, false
		}
		return v, false
	}
	x, err := r.dec.DecodeInt64() // every other integer fits an int64
	if !r.ok(err) {
		return 0, false
	}
	return uint64(x), x < 0
}

// intIn reads an integer that must lie in [lo, hi].
func (r *reader) intIn(lo, hi int64) int64 {
	v, neg := r.int()
	x := int64(v)
	if r.err != nil || (!neg && v > math.MaxInt64) || x < lo || x > hi {
		r.fail()
		return 0
	}
	return x
}

// float reads a float or an integer as a float64.
func (r *reader) float() float64 {
	switch r.kind() {
	case mpFloat:
		f, err := r.dec.DecodeFloat64()
		if !r.ok(err) {
			return 0
		}
		return f
	case mpInt:
		// Not DecodeFloat64: it reads a uint64 above math.MaxInt64 as
		// negative.
		v, neg := r.int()
		if neg {
			return float64(int64(v))
		}
		return float64(v)
	}
	r.fail()
	return 0
}

// str returns the bytes of a str (or bin) value, aliasing the payload.
func (r *reader) str() []byte {
	if k := r.kind(); k != mpStr && k != mpBin {
		r.fail()
		return nil
	}
	n, err := r.dec.DecodeBytesLen()
	if !r.ok(err) {
		return nil
	}
	return r.take(n)
}

// arrayLen reads an array header. The length is checked against the bytes
// left (every element takes at least one), so a hostile header can't make
// a caller loop or allocate past the payload's size.
func (r *reader) arrayLen() int {
	if r.kind() != mpArray {
		r.fail()
		return 0
	}
	n, err := r.dec.DecodeArrayLen()
	if !r.ok(err) || n > r.br.Len() {
		r.fail()
		return 0
	}
	return n
}

// mapLen reads a map header (pairs, each at least two bytes).
func (r *reader) mapLen() int {
	if r.kind() != mpMap {
		r.fail()
		return 0
	}
	n, err := r.dec.DecodeMapLen()
	if !r.ok(err) || n > r.br.Len()/2 {
		r.fail()
		return 0
	}
	return n
}

// skip consumes one value of any type and returns its raw bytes.
func (r *reader) skip() []byte {
	start := r.off()
	r.skipValue()
	if r.err != nil {
		return nil
	}
	return r.payload[start:r.off():r.off()]
}

// skipValue consumes one value of any type, nested at most maxDepth deep.
func (r *reader) skipValue() {
	if r.depth++; r.depth > maxDepth {
		r.fail()
	}
	switch r.kind() {
	case mpArray:
		for n := r.arrayLen(); n > 0 && r.err == nil; n-- {
			r.skipValue()
		}
	case mpMap:
		for n := r.mapLen(); n > 0 && r.err == nil; n-- {
			r.skipValue()
			r.skipValue()
		}
	case mpStr, mpBin:
		r.str()
	case mpExt:
		_, n, err := r.dec.DecodeExtHeader()
		if r.ok(err) {
			r.take(n)
		}
	default:
		// A scalar: nil, bool, an int or a float (Skip refuses 0xc1).
		// Checked above, so Skip never recurses here.
		if r.err == nil {
			r.ok(r.dec.Skip())
		}
	}
	r.depth--
}
