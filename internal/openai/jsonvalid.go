package openai

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/bits"

	"github.com/valyala/fastjson"
)

// MaxJSONDepth is how deep a body the router reads may nest: fastjson's
// parser goes no deeper (ReadRequest), so the check below refuses more.
const MaxJSONDepth = fastjson.MaxDepth

// Why CheckJSON refused a body.
var (
	errJSONSyntax = errors.New("malformed JSON")
	ErrJSONDepth  = errors.New("JSON nested too deep")
)

// CheckJSON checks that b is one strict JSON value — gjson.Valid's verdict
// (FuzzValidJSON): no UTF-8 check within strings, as gjson makes none —
// nested no more than MaxJSONDepth levels (ErrJSONDepth when a bracket
// past that comes before any error). Requests and whole answers are
// checked before they are read or passed on.
//
// It reads b once, without recursion: the open arrays and objects are a
// stack of MaxJSONDepth bytes, so a client's 8 MiB of "[" costs a 400,
// not the goroutine's stack (TestReadRequestDeepBody). segmentio's
// validator, which it replaced, cost more per value and per call: on the
// harness's 300-byte request and 500-byte answer, which every
// non-streamed request has checked, 490 and 640 ns against ~160 and
// ~370; on 8 KB of prose 0.85 µs against ~1.0, and on 8 KB of source code
// (an escape every few bytes) ~10 µs against ~8 (BenchmarkValidJSON).
func CheckJSON(b []byte) error { return CheckJSONMembers(b, nil) }

// CheckJSONMembers is CheckJSON, noting in m, when b is an object and m
// is not nil, where its members are: the scan that ReadRequest and
// wholeUsage made of a body's members after checking it, ~1 µs of a
// request (BenchmarkRouterWork), is then no second pass.
func CheckJSONMembers(b []byte, m *ObjectMembers) error {
	var closers [MaxJSONDepth]byte // '}' or ']' for each open level
	depth := 0
	i := 0
	if m != nil {
		m.n, m.over = 0, false
	}
	for {
		// A value starts at b[i], after spaces.
		i = skipJSONSpace(b, i)
		if i >= len(b) {
			return errJSONSyntax
		}
		if m != nil && depth == 1 && closers[0] == '}' {
			m.value(i, false)
		}
		switch c := b[i]; c {
		case '{', '[':
			if depth == MaxJSONDepth {
				return ErrJSONDepth
			}
			closer := c + 2 // '{'+2 is '}', '['+2 is ']'
			i = skipJSONSpace(b, i+1)
			if i < len(b) && b[i] == closer {
				i++ // empty: a value that ended
				break
			}
			closers[depth] = closer
			depth++
			if c == '[' {
				continue // its first element
			}
			k := i
			var ke int
			if ke, i = memberHead(b, i); i < 0 {
				return errJSONSyntax
			}
			if m != nil && depth == 1 {
				m.key(k, ke)
			}
			continue // its first member's value
		case '"':
			i = stringEndStrict(b, i)
		case 't':
			i = literalEnd(b, i, "true")
		case 'f':
			i = literalEnd(b, i, "false")
		case 'n':
			i = literalEnd(b, i, "null")
		default:
			i = numberEnd(b, i)
		}
		if i < 0 {
			return errJSONSyntax
		}
		// A value ended before b[i]: what follows closes its array or
		// object, or separates it from the next.
		for {
			if m != nil && depth == 1 && closers[0] == '}' {
				m.value(i, true)
			}
			i = skipJSONSpace(b, i)
			if depth == 0 {
				if i != len(b) {
					return errJSONSyntax
				}
				return nil
			}
			if i >= len(b) {
				return errJSONSyntax
			}
			if b[i] == closers[depth-1] {
				depth--
				i++
				continue
			}
			if b[i] != ',' {
				return errJSONSyntax
			}
			i++
			if closers[depth-1] == '}' {
				k := skipJSONSpace(b, i)
				var ke int
				if ke, i = memberHead(b, k); i < 0 {
					return errJSONSyntax
				}
				if m != nil && depth == 1 {
					m.key(k, ke)
				}
			}
			break
		}
	}
}

// ValidJSON is CheckJSON's verdict alone.
func ValidJSON(b []byte) bool { return CheckJSON(b) == nil }

// memberHead reads an object member's key and colon at b[i]: the index
// after the key's string, and next, the index after the colon; next is
// -1 when they are not there.
func memberHead(b []byte, i int) (keyEnd, next int) {
	if i >= len(b) || b[i] != '"' {
		return 0, -1
	}
	if keyEnd = stringEndStrict(b, i); keyEnd < 0 {
		return 0, -1
	}
	if i = skipJSONSpace(b, keyEnd); i >= len(b) || b[i] != ':' {
		return 0, -1
	}
	return keyEnd, i + 1
}

// Eight bytes at a time: lanes holds one in each byte, high its top bit.
const (
	lanes = 0x0101010101010101
	high  = 0x8080808080808080
)

// specials flags the bytes of w that end a string's plain run — a quote,
// a backslash, a control byte — with the classic "has a zero byte" test
// (the complement of w stands in for that of w^c: the constants' top bits
// are 0). The lowest flag is exact (a false one needs a borrow from a
// true one below it); 0 means none.
func specials(w uint64) uint64 {
	return ((w ^ '"'*lanes - lanes) | (w ^ '\\'*lanes - lanes) | (w - ' '*lanes)) &^ w & high
}

// stringEndStrict is the index after the strict JSON string at b[i] (a
// quote), or -1: a control byte in it, an escape JSON has not, or no
// closing quote. It goes from escape to escape. The first sixteen bytes
// after each — where keys, short values and the text between a line's
// escapes end — are read as two words (specials); a longer run has its
// end found by bytes.IndexByte's vector search (~50 GB/s here) and its
// bytes checked for control bytes thirty-two at a time (noControl). The
// closing quote's search is kept across escapes: a string dense with
// them is still searched once.
func stringEndStrict(b []byte, i int) int {
	i++
	q := -1    // the first quote at or after i, once searched for
	short := 0 // escapes in a row found within sixteen bytes of the last
	for {
		if short == 8 {
			// Text dense with escapes (source code, JSON in JSON): the
			// words' tests cost more than reading byte by byte, as
			// segmentio's validator read any string with an escape.
			return stringEndBytes(b, i)
		}
		if i+16 <= len(b) {
			m1, m2 := specials(binary.LittleEndian.Uint64(b[i:])), specials(binary.LittleEndian.Uint64(b[i+8:]))
			switch {
			case m1 != 0:
				i += bits.TrailingZeros64(m1) >> 3
			case m2 != 0:
				i += 8 + bits.TrailingZeros64(m2)>>3
			default:
				i += 16
				goto long
			}
			switch c := b[i]; {
			case c == '"':
				return i + 1
			case c < ' ':
				return -1
			}
			if i = escapeEnd(b, i); i < 0 { // a backslash
				return -1
			}
			short++
			continue
		}
	long:
		short = 0
		if q < i {
			k := bytes.IndexByte(b[i:], '"')
			if k < 0 {
				return -1
			}
			q = i + k
		}
		run := b[i:q]
		if e := bytes.IndexByte(run, '\\'); e >= 0 {
			run = run[:e]
		}
		if !noControl(run) {
			return -1
		}
		if i += len(run); i == q {
			return q + 1
		}
		if i = escapeEnd(b, i); i < 0 { // a backslash
			return -1
		}
	}
}

// stringEndBytes is stringEndStrict read a byte at a time from b[i],
// within a string.
func stringEndBytes(b []byte, i int) int {
	for ; i < len(b); i++ {
		c := b[i]
		if c != '"' && c != '\\' && c >= ' ' {
			continue
		}
		switch {
		case c == '"':
			return i + 1
		case c < ' ':
			return -1
		}
		j := escapeEnd(b, i)
		if j < 0 {
			return -1
		}
		i = j - 1
	}
	return -1
}

// noControl reports that run has no byte under 0x20, thirty-two bytes at
// a time.
func noControl(run []byte) bool {
	for len(run) >= 32 {
		w0, w1 := binary.LittleEndian.Uint64(run), binary.LittleEndian.Uint64(run[8:16])
		w2, w3 := binary.LittleEndian.Uint64(run[16:24]), binary.LittleEndian.Uint64(run[24:32])
		if ((w0-' '*lanes)&^w0|(w1-' '*lanes)&^w1|(w2-' '*lanes)&^w2|(w3-' '*lanes)&^w3)&high != 0 {
			return false
		}
		run = run[32:]
	}
	for len(run) >= 8 {
		w := binary.LittleEndian.Uint64(run)
		if (w-' '*lanes)&^w&high != 0 {
			return false
		}
		run = run[8:]
	}
	for _, c := range run {
		if c < ' ' {
			return false
		}
	}
	return true
}

// escapeEnd is the index after the escape at b[i] (a backslash), or -1
// when JSON has no such escape.
func escapeEnd(b []byte, i int) int {
	if i+1 >= len(b) {
		return -1
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2
	case 'u':
		if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
			return -1
		}
		return i + 6
	}
	return -1
}

func isHex(c byte) bool { return c-'0' < 10 || (c|0x20)-'a' < 6 }

// literalEnd is the index after lit at b[i], or -1.
func literalEnd(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// numberEnd is the index after the JSON number at b[i], or -1: an
// optional minus, 0 or digits not led by 0, then optionally a fraction
// and an exponent, each with at least one digit.
func numberEnd(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b) || !isDigit(b[i]):
		return -1
	case b[i] == '0':
		i++
	default:
		i = digitsEnd(b, i)
	}
	if i < len(b) && b[i] == '.' {
		if i++; i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		i = digitsEnd(b, i)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		if i++; i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		i = digitsEnd(b, i)
	}
	return i
}

func isDigit(c byte) bool { return c-'0' < 10 }

func digitsEnd(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}
