package h1

import "bytes"

// The lines, fields and tokens ResponseEnd and RequestLen read.

// lineBody is l without its line end, which must be CRLF, and refused if
// it holds another CR: a lone CR or LF ends a line for some readers and
// not for others.
func lineBody(l []byte) ([]byte, error) {
	if len(l) < 2 || l[len(l)-2] != '\r' {
		return nil, errLineEnd
	}
	l = l[:len(l)-2]
	if bytes.IndexByte(l, '\r') >= 0 {
		return nil, errLineEnd
	}
	return l, nil
}

// splitField is a field line's name and its value without surrounding
// whitespace. A line that starts with whitespace continues the last
// (obsolete folding) and one with whitespace before its colon is read
// as another name by some readers: both refused, as RFC 9112 lets a
// relay do.
func splitField(l []byte) (name, value []byte, err error) {
	if len(l) > 0 && (l[0] == ' ' || l[0] == '\t') {
		return nil, nil, errObsFold
	}
	i := bytes.IndexByte(l, ':')
	if i <= 0 {
		return nil, nil, errFieldName
	}
	name = l[:i]
	for _, c := range name {
		if !isTchar(c) {
			return nil, nil, errFieldName
		}
	}
	value = l[i+1:]
	for len(value) > 0 && (value[0] == ' ' || value[0] == '\t') {
		value = value[1:]
	}
	for len(value) > 0 && (value[len(value)-1] == ' ' || value[len(value)-1] == '\t') {
		value = value[:len(value)-1]
	}
	return name, value, nil
}

// parseLength reads a Content-Length: decimal digits only (no sign, no
// list), at most 18 of them so that it cannot overflow.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// equalFold reports whether b is lower, ignoring the case of ASCII
// letters; lower is lower case.
func equalFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// isTchar reports whether c may be in a field name (RFC 9110's tchar).
func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
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

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
