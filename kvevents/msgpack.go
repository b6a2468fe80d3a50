package kvevents

import (
	"encoding/binary"
	"math"
)

// A small MessagePack reader and writer for the subset msgspec emits for KV
// events: nil, bool, integers, floats, str, bin, arrays, maps (ext values
// are skipped). Hand-written rather than a reflection-based library because
// the wire types are unions — a block hash is an int or bytes, an event an
// array or a map — and because a reader that checks every length against
// what is left can never panic on hostile input (FuzzDecodeBatch).

// reader walks a msgpack buffer. Every method checks bounds; on malformed
// input it sets err and returns zero values, so callers check err once.
type reader struct {
	b   []byte
	off int
	err error
	// depth bounds nesting in skip, so a deeply nested value can't blow the
	// stack.
	depth int
}

// maxDepth bounds nesting while skipping unknown values.
const maxDepth = 32

func (r *reader) fail() {
	if r.err == nil {
		r.err = ErrMalformed
	}
}

func (r *reader) take(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b)-r.off {
		r.fail()
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) peek() byte {
	if r.err != nil || r.off >= len(r.b) {
		r.fail()
		return 0
	}
	return r.b[r.off]
}

func (r *reader) byte1() byte {
	s := r.take(1)
	if s == nil {
		return 0
	}
	return s[0]
}

func (r *reader) uint(n int) uint64 {
	s := r.take(n)
	switch len(s) {
	case 1:
		return uint64(s[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(s))
	case 4:
		return uint64(binary.BigEndian.Uint32(s))
	case 8:
		return binary.BigEndian.Uint64(s)
	}
	return 0
}

// isNil consumes a nil if one is next.
func (r *reader) isNil() bool {
	if r.peek() == 0xc0 && r.err == nil {
		r.off++
		return true
	}
	return false
}

// kind of the next value, without consuming it.
type mpKind uint8

const (
	mpOther mpKind = iota
	mpNil
	mpInt
	mpFloat
	mpStr
	mpBin
	mpArray
	mpMap
)

func (r *reader) kind() mpKind {
	c := r.peek()
	if r.err != nil {
		return mpOther
	}
	switch {
	case c <= 0x7f || c >= 0xe0, c >= 0xcc && c <= 0xd3:
		return mpInt
	case c >= 0xa0 && c <= 0xbf, c >= 0xd9 && c <= 0xdb:
		return mpStr
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		return mpArray
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		return mpMap
	case c == 0xc0:
		return mpNil
	case c == 0xca, c == 0xcb:
		return mpFloat
	case c >= 0xc4 && c <= 0xc6:
		return mpBin
	}
	return mpOther
}

// int reads any integer as its 64-bit pattern; neg reports a negative
// signed value (so a caller can tell int64(-1) from uint64(2^64−1)).
func (r *reader) int() (v uint64, neg bool) {
	c := r.byte1()
	switch {
	case r.err != nil:
		return 0, false
	case c <= 0x7f:
		return uint64(c), false
	case c >= 0xe0:
		return uint64(int64(int8(c))), true
	}
	switch c {
	case 0xcc:
		return r.uint(1), false
	case 0xcd:
		return r.uint(2), false
	case 0xce:
		return r.uint(4), false
	case 0xcf:
		return r.uint(8), false
	case 0xd0:
		x := int64(int8(r.uint(1)))
		return uint64(x), x < 0
	case 0xd1:
		x := int64(int16(r.uint(2)))
		return uint64(x), x < 0
	case 0xd2:
		x := int64(int32(r.uint(4)))
		return uint64(x), x < 0
	case 0xd3:
		x := int64(r.uint(8))
		return uint64(x), x < 0
	}
	r.fail()
	return 0, false
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

func (r *reader) float() float64 {
	switch r.kind() {
	case mpFloat:
		if r.byte1() == 0xca {
			return float64(math.Float32frombits(uint32(r.uint(4))))
		}
		return math.Float64frombits(r.uint(8))
	case mpInt:
		v, neg := r.int()
		if neg {
			return float64(int64(v))
		}
		return float64(v)
	}
	r.fail()
	return 0
}

// str returns the bytes of a str (or bin) value, aliasing the buffer.
func (r *reader) str() []byte {
	c := r.byte1()
	var n int
	switch {
	case r.err != nil:
		return nil
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n = int(r.uint(1))
	case c == 0xda || c == 0xc5:
		n = int(r.uint(2))
	case c == 0xdb || c == 0xc6:
		n = int(r.uint(4))
	default:
		r.fail()
		return nil
	}
	return r.take(n)
}

// arrayLen reads an array header. The length is checked against the bytes
// left (every element takes at least one), so a hostile header can't make
// a caller allocate gigabytes.
func (r *reader) arrayLen() int {
	c := r.byte1()
	var n int
	switch {
	case r.err != nil:
		return 0
	case c >= 0x90 && c <= 0x9f:
		n = int(c & 0x0f)
	case c == 0xdc:
		n = int(r.uint(2))
	case c == 0xdd:
		n = int(r.uint(4))
	default:
		r.fail()
		return 0
	}
	if r.err != nil || n > len(r.b)-r.off {
		r.fail()
		return 0
	}
	return n
}

// mapLen reads a map header (pairs, each at least two bytes).
func (r *reader) mapLen() int {
	c := r.byte1()
	var n int
	switch {
	case r.err != nil:
		return 0
	case c >= 0x80 && c <= 0x8f:
		n = int(c & 0x0f)
	case c == 0xde:
		n = int(r.uint(2))
	case c == 0xdf:
		n = int(r.uint(4))
	default:
		r.fail()
		return 0
	}
	if r.err != nil || n > (len(r.b)-r.off)/2 {
		r.fail()
		return 0
	}
	return n
}

// skip consumes one value of any type and returns its raw bytes.
func (r *reader) skip() []byte {
	start := r.off
	r.skipValue()
	if r.err != nil {
		return nil
	}
	return r.b[start:r.off]
}

func (r *reader) skipValue() {
	r.depth++
	defer func() { r.depth-- }()
	if r.depth > maxDepth {
		r.fail()
		return
	}
	c := r.peek()
	if r.err != nil {
		return
	}
	switch r.kind() {
	case mpNil:
		r.off++
	case mpInt:
		r.int()
	case mpFloat:
		r.float()
	case mpStr, mpBin:
		r.str()
	case mpArray:
		for n := r.arrayLen(); n > 0 && r.err == nil; n-- {
			r.skipValue()
		}
	case mpMap:
		for n := r.mapLen(); n > 0 && r.err == nil; n-- {
			r.skipValue()
			r.skipValue()
		}
	default:
		r.off++
		switch c {
		case 0xc2, 0xc3: // false, true
		case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16
			r.take(1 + 1<<(c-0xd4)) // type byte, then 1–16 data bytes
		case 0xc7, 0xc8, 0xc9: // ext 8, 16, 32
			n := int(r.uint(1 << (c - 0xc7)))
			r.take(n + 1)
		default: // 0xc1 is never used
			r.fail()
		}
	}
}

// writer appends msgpack values in msgspec's encodings: the smallest form
// of every integer, float64 for floats, str8 for strings of 32–255 bytes.
type writer struct{ b []byte }

func (w *writer) nil() { w.b = append(w.b, 0xc0) }

func (w *writer) uint(v uint64) {
	switch {
	case v <= 0x7f:
		w.b = append(w.b, byte(v))
	case v <= math.MaxUint8:
		w.b = append(w.b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xce), uint32(v))
	default:
		w.b = binary.BigEndian.AppendUint64(append(w.b, 0xcf), v)
	}
}

func (w *writer) int(v int64) {
	switch {
	case v >= 0:
		w.uint(uint64(v))
	case v >= -32:
		w.b = append(w.b, byte(int8(v)))
	case v >= math.MinInt8:
		w.b = append(w.b, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xd1), uint16(int16(v)))
	case v >= math.MinInt32:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xd2), uint32(int32(v)))
	default:
		w.b = binary.BigEndian.AppendUint64(append(w.b, 0xd3), uint64(v))
	}
}

func (w *writer) float(f float64) {
	w.b = binary.BigEndian.AppendUint64(append(w.b, 0xcb), math.Float64bits(f))
}

func (w *writer) str(s string) {
	n := len(s)
	switch {
	case n < 32:
		w.b = append(w.b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		w.b = append(w.b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xda), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xdb), uint32(n))
	}
	w.b = append(w.b, s...)
}

func (w *writer) bin(p []byte) {
	n := len(p)
	switch {
	case n <= math.MaxUint8:
		w.b = append(w.b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xc5), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xc6), uint32(n))
	}
	w.b = append(w.b, p...)
}

func (w *writer) array(n int) {
	switch {
	case n < 16:
		w.b = append(w.b, 0x90|byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xdc), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xdd), uint32(n))
	}
}

func (w *writer) mapHeader(n int) {
	switch {
	case n < 16:
		w.b = append(w.b, 0x80|byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xde), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xdf), uint32(n))
	}
}
