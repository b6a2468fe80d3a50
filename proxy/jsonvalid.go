package proxy

import (
	"encoding/binary"

	"github.com/tidwall/gjson"
	"github.com/valyala/fastjson"
)

// validJSON reports whether b is one JSON value, exactly as gjson.Valid
// does (FuzzValidJSON), in about half its time: a request's prompt and a
// whole response are checked before they are read, and at 8 KB gjson's
// check was the largest single cost of a request (~10 µs, `bench
// proxy-cost --request-bytes 8192`). fastjson's validator takes
// IndexByte's strides through strings where gjson goes a byte at a time,
// but it misses a control character before an escape in a string; a
// control character is rare in a body (clients and engines write compact
// JSON, escaping them), so a body with one — pretty-printed, or a raw tab
// in a string — takes gjson's exact check instead.
func validJSON(b []byte) bool {
	if hasControlByte(b) {
		return gjson.Valid(bytesView(b))
	}
	return fastjson.ValidateBytes(b) == nil
}

// hasControlByte reports whether b holds a byte below 0x20, eight bytes
// at a time: w-0x20… borrows into a byte's top bit only where that byte
// is below 0x20 (or the borrow came from one that was), and &^w drops
// bytes whose top bit was already set.
func hasControlByte(b []byte) bool {
	const below, top = 0x2020202020202020, 0x8080808080808080
	for len(b) >= 8 {
		w := binary.LittleEndian.Uint64(b)
		if (w-below)&^w&top != 0 {
			return true
		}
		b = b[8:]
	}
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}
