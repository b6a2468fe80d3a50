package h1

import "bytes"

// Head reads a response head field by field: its status line, then its
// fields in order. It is for a head ResponseEnd has accepted — its lines
// end in CRLF, none is folded, every field line is name ':' value — so a
// relay that rewrites a few fields of the head it passes on need not parse
// it into a header structure first. Its zero value holds no head.
type Head struct {
	rest  []byte // the field lines not yet read, each with its CRLF
	ended bool   // Next came to the empty line
}

// ReadHead starts reading head, a response head up to and including its
// empty line. status is its status code; ok is false when head does not
// start with an HTTP/1.1 status line or does not end with an empty line.
func ReadHead(head []byte) (h Head, status int, ok bool) {
	if !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		return Head{}, 0, false
	}
	i := bytes.IndexByte(head, '\n')
	l, err := lineBody(head[:i+1])
	if err != nil {
		return Head{}, 0, false
	}
	if status, ok = status11(l); !ok {
		return Head{}, 0, false
	}
	return Head{rest: head[i+1:]}, status, true
}

// Next is the next field's name and its value without surrounding
// whitespace; ok is false at the head's end, or at a line that is not a
// field (which an accepted head does not have: Ended tells).
func (h *Head) Next() (name, value []byte, ok bool) {
	i := bytes.IndexByte(h.rest, '\n')
	if i < 0 {
		h.rest = nil
		return nil, nil, false
	}
	l, err := lineBody(h.rest[:i+1])
	h.rest = h.rest[i+1:]
	if err != nil || len(l) == 0 {
		h.ended = err == nil
		h.rest = nil
		return nil, nil, false
	}
	name, value, err = splitField(l)
	if err != nil {
		h.rest = nil
		return nil, nil, false
	}
	return name, value, true
}

// Ended reports whether Next read every field to the head's empty line,
// rather than stopping at a line that is not a field.
func (h *Head) Ended() bool { return h.ended }

// ValidValue reports whether v holds only the bytes a field value may
// (RFC 9110 §5.5: visible characters, space, tab, obs-text). ResponseEnd
// does not read values; fasthttp refuses a response whose head holds any
// other, as net/textproto does.
func ValidValue(v []byte) bool {
	for _, c := range v {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// EqualFold reports whether b is lower, ignoring the case of ASCII
// letters; lower is lower case.
func EqualFold(b []byte, lower string) bool { return equalFold(b, lower) }
