package h1

import (
	"errors"
	"fmt"
	"math"
)

// The request grammar: every request the router reads passes it before
// anything acts on it, whichever path then serves the request.

// DefaultMaxFields bounds a request head's field lines where no other
// bound is given: HAProxy's default (tune.http.maxhdr) is 101 with the
// request line.
const DefaultMaxFields = 100

// Why a request is refused. Each refusal wraps one of them, which says
// how to answer: a front door answers with the status noted and closes
// the connection, since what follows the refused bytes cannot be told
// apart from them.
var (
	// ErrMalformed is a request that does not follow RFC 9112's grammar,
	// or one whose framing readers may disagree on: 400.
	ErrMalformed = errors.New("h1: malformed request")
	// ErrHeadTooLarge is a head over its size or field-count bound: 431.
	ErrHeadTooLarge = errors.New("h1: request head too large")
	// ErrUnknownCoding is a Transfer-Encoding naming a coding this reader
	// does not know (RFC 9112 §6.1): 501.
	ErrUnknownCoding = errors.New("h1: unknown transfer coding")
	// ErrVersion is a well-formed request line of an HTTP version other
	// than 1.0 and 1.1: 505.
	ErrVersion = errors.New("h1: HTTP version not supported")
)

var (
	errReqLine     = malformed("a request line that is not METHOD SP request-target SP HTTP/1.x")
	errReqTarget   = malformed("a request target that is empty, holds a space or a control character, or does not fit its method")
	errReqLineEnd  = malformed("a line not ended by CRLF, or a CR inside one")
	errReqFold     = malformed("a folded field line (obs-fold)")
	errReqName     = malformed("a field line without a token name and a colon right after it")
	errReqValue    = malformed("a control character in a field value")
	errReqLength   = malformed("a repeated or malformed Content-Length")
	errReqTE       = malformed("a Transfer-Encoding other than chunked alone")
	errReqBoth     = malformed("both Content-Length and Transfer-Encoding")
	errReqTE10     = malformed("Transfer-Encoding in an HTTP/1.0 request")
	errReqHost     = malformed("an HTTP/1.1 request without one Host, or a repeated or empty Host")
	errReqTooLong  = fmt.Errorf("%w: over the size bound", ErrHeadTooLarge)
	errReqTooMany  = fmt.Errorf("%w: more field lines than the bound", ErrHeadTooLarge)
	errReqCoding   = fmt.Errorf("%w: in Transfer-Encoding", ErrUnknownCoding)
	errReqVersion  = fmt.Errorf("%w: HTTP/1.0 and HTTP/1.1 only", ErrVersion)
	errReqChunking = malformed("a malformed chunked body")
)

func malformed(why string) error { return fmt.Errorf("%w: %s", ErrMalformed, why) }

// MalformedBody is err, a refusal of a request's chunked body by Chunked,
// as a refusal of the request: ErrMalformed wrapped around it.
func MalformedBody(err error) error { return fmt.Errorf("%w: %w", errReqChunking, err) }

// Limits bound a request head. Zero fields take the defaults.
type Limits struct {
	MaxHead   int // bytes, from the first byte read to the empty line's end [DefaultMaxHead]
	MaxFields int // field lines [DefaultMaxFields]
}

// Request is what a request head says of the message, once read whole.
type Request struct {
	// Start is the bytes of empty lines (CRLF) before the request line,
	// which a server ignores (RFC 9112 §2.2): the request is b[Start:].
	Start int
	// HeadEnd is where the head ends, its empty line included, from b's
	// start; 0 while the head is not all in.
	HeadEnd int
	// Length is the body's Content-Length (0 without one); -1 for a
	// chunked body.
	Length int64
	HTTP10 bool // an HTTP/1.0 request
}

// Complete reports whether the head is all in.
func (r Request) Complete() bool { return r.HeadEnd > 0 }

// Chunked reports whether the body is chunked.
func (r Request) Chunked() bool { return r.Length < 0 }

// ParseRequest checks the request head at the start of b against RFC
// 9112's grammar, in one pass and without allocating, and says where the
// head ends and how its body is framed. A head not all in yet that breaks
// no rule so far is incomplete (Complete false, nil error); a broken one
// is refused as soon as the first byte that breaks a rule is in, so a
// client is not left waiting for a head that cannot be read (a bare LF as
// a line end, say). The refusal wraps ErrMalformed, ErrHeadTooLarge,
// ErrUnknownCoding or ErrVersion.
//
// Accepted: a request line METHOD SP request-target SP HTTP/1.0 or
// HTTP/1.1 (method a token; the target without spaces or controls, in
// origin form, absolute form, "*" for OPTIONS, authority form for
// CONNECT); field lines name ':' OWS value OWS, the name a token, the
// value without control characters but HTAB; every line ended by CRLF;
// at most one Content-Length (digits only) or one Transfer-Encoding,
// which is exactly chunked, and none in HTTP/1.0; one Host, not empty,
// which HTTP/1.0 may leave out. Everything else is
// refused: that is the grammar every reader agrees on, so no reader
// behind the router can find another request's start.
func ParseRequest(b []byte, lim Limits) (Request, error) {
	var s RequestScan
	return s.Scan(b, lim)
}

// RequestScan is ParseRequest over a head that arrives in pieces: each
// Scan is given the bytes so far — the earlier ones unchanged — and
// resumes at the line it stopped in, so a head that trickles in is read
// once, not once per piece. Its zero value starts a request; Reset
// starts the next.
type RequestScan struct {
	r      Request
	err    error
	at     int  // the start of the first line not yet read
	line   bool // the request line is read
	fields int
	cl, te bool
	host   bool
}

// Reset readies s for another request.
func (s *RequestScan) Reset() { *s = RequestScan{} }

// Scan is ParseRequest over b, the request's bytes so far, from where the
// last Scan stopped. Once it has returned a complete head or an error it
// returns the same again.
func (s *RequestScan) Scan(b []byte, lim Limits) (Request, error) {
	maxHead, maxFields := lim.MaxHead, lim.MaxFields
	if maxHead <= 0 {
		maxHead = DefaultMaxHead
	}
	if maxFields <= 0 {
		maxFields = DefaultMaxFields
	}
	if s.r.HeadEnd > 0 || s.err != nil {
		return s.r, s.err
	}
	// Bytes past the bound are never read: a head is refused for its
	// size only when no rule broke within it.
	s.err = s.scan(b[:min(len(b), maxHead)], maxFields)
	if s.err == nil && s.r.HeadEnd == 0 && len(b) > maxHead {
		s.err = errReqTooLong
	}
	if s.err != nil {
		s.r = Request{}
	}
	return s.r, s.err
}

// scan reads b's lines from s.at: HeadEnd is set once the head is all
// in; nil error and no HeadEnd, the next line is not all in.
func (s *RequestScan) scan(b []byte, maxFields int) error {
	if !s.line {
		i := s.at
		for i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n' {
			i += 2
		}
		s.r.Start, s.at = i, i
		if i+1 == len(b) && b[i] == '\r' {
			return nil // an empty line's CR, or a bare one: the next byte tells
		}
		end, err := s.requestLine(b, i)
		if end == 0 || err != nil {
			return err
		}
		s.line, s.at = true, end
	}
	for {
		end, err := s.fieldLine(b, s.at, maxFields)
		if end == 0 || err != nil {
			return err
		}
		s.at = end
		if s.r.HeadEnd > 0 {
			return nil
		}
	}
}

// requestLine reads the request line at b[i:]: end is where the next
// line starts, 0 while the line is not all in.
func (s *RequestScan) requestLine(b []byte, i int) (end int, err error) {
	m := i
	for i < len(b) && class[b[i]]&cToken != 0 {
		i++
	}
	if i == len(b) {
		return 0, nil
	}
	if i == m || b[i] != ' ' {
		return lineError(b, i, errReqLine)
	}
	method := b[m:i]
	i++
	t := i
	for i < len(b) && class[b[i]]&cTarget != 0 {
		i++
	}
	if i == len(b) {
		return 0, nil
	}
	if i == t || b[i] != ' ' {
		return lineError(b, i, errReqTarget)
	}
	if !targetFits(method, b[t:i]) {
		return 0, errReqTarget
	}
	i++
	// HTTP-version = "HTTP/" DIGIT "." DIGIT, case-sensitive, then CRLF.
	const version = "HTTP/d.d\r\n"
	for k := 0; k < len(version); k++ {
		if i+k == len(b) {
			return 0, nil
		}
		c := b[i+k]
		switch want := version[k]; {
		case want == 'd':
			if c < '0' || c > '9' {
				return 0, errReqLine
			}
		case c == want:
		case k == len(version)-1:
			return 0, errReqLineEnd // a CR not followed by LF
		default:
			return lineError(b, i+k, errReqLine)
		}
	}
	major, minor := b[i+5], b[i+7]
	if major != '1' || minor != '0' && minor != '1' {
		return 0, errReqVersion
	}
	s.r.HTTP10 = minor == '0'
	return i + len(version), nil
}

// lineError is the refusal of a line that broke off at b[i], where a
// byte the grammar has no place for stands: a line-end error where it is
// a lone CR or LF (a bare-LF head is refused as such, at its first
// line), else why. A CR last in b is not judged until the byte after it
// is in (end and err both zero).
func lineError(b []byte, i int, why error) (end int, err error) {
	switch {
	case b[i] == '\n':
		return 0, errReqLineEnd
	case b[i] != '\r':
		return 0, why
	case i+1 == len(b):
		return 0, nil
	case b[i+1] != '\n':
		return 0, errReqLineEnd
	}
	return 0, why
}

// fieldLine reads the field line (or the head's empty line) at b[i:]:
// end is where the next line starts, 0 while it is not all in.
func (s *RequestScan) fieldLine(b []byte, i, maxFields int) (end int, err error) {
	if i == len(b) {
		return 0, nil
	}
	switch b[i] {
	case '\r':
		if i+1 == len(b) {
			return 0, nil
		}
		if b[i+1] != '\n' {
			return 0, errReqLineEnd
		}
		return i + 2, s.headEnd(i + 2)
	case '\n':
		return 0, errReqLineEnd
	case ' ', '\t':
		return 0, errReqFold
	}
	n := i
	for i < len(b) && class[b[i]]&cToken != 0 {
		i++
	}
	if i == len(b) {
		return 0, nil
	}
	if i == n || b[i] != ':' {
		return lineError(b, i, errReqName)
	}
	name := b[n:i]
	i++
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	v := i
	for i < len(b) && class[b[i]]&cValue != 0 {
		i++
	}
	if i+1 >= len(b) {
		if i < len(b) && b[i] != '\r' {
			return lineError(b, i, errReqValue)
		}
		return 0, nil
	}
	if b[i] != '\r' || b[i+1] != '\n' {
		return lineError(b, i, errReqValue)
	}
	if s.fields++; s.fields > maxFields {
		return 0, errReqTooMany
	}
	value := b[v:i]
	for len(value) > 0 && (value[len(value)-1] == ' ' || value[len(value)-1] == '\t') {
		value = value[:len(value)-1]
	}
	return i + 2, s.framing(name, value)
}

// framing takes what a field line says of the body's framing.
func (s *RequestScan) framing(name, value []byte) error {
	switch {
	case len(name) == len("content-length") && equalFold(name, "content-length"):
		n, ok := parseLength(value)
		if s.cl || !ok {
			return errReqLength // a repeated one even if equal, as fasthttp
		}
		s.cl, s.r.Length = true, n
	case len(name) == len("transfer-encoding") && equalFold(name, "transfer-encoding"):
		if s.te {
			return errReqTE // a list across lines: chunked is then not alone
		}
		if err := transferCoding(value); err != nil {
			return err
		}
		s.te = true
	case len(name) == len("host") && equalFold(name, "host"):
		if s.host || len(value) == 0 {
			return errReqHost
		}
		s.host = true
	}
	return nil
}

// headEnd judges the head at its empty line, which ends at end.
func (s *RequestScan) headEnd(end int) error {
	switch {
	case s.cl && s.te:
		// RFC 9112 §6.3 lets a server read on by Transfer-Encoding; a
		// reader behind it may not, so neither does the router.
		return errReqBoth
	case s.te && s.r.HTTP10:
		return errReqTE10 // RFC 9112 §6.1: the framing is faulty
	case !s.host && !s.r.HTTP10:
		return errReqHost // RFC 9112 §3.2; fasthttp refuses it too
	case s.te:
		s.r.Length = -1
	}
	s.r.HeadEnd = end
	return nil
}

// transferCoding judges a Transfer-Encoding value: chunked alone is the
// one a request may have. A list naming a coding not known is 501 (RFC
// 9112 §6.1); any other list, identity and gzip among them, is 400: the
// router decodes none but chunked, nor may chunked be applied twice.
func transferCoding(v []byte) error {
	if equalFold(v, "chunked") {
		return nil
	}
	for len(v) > 0 {
		var el []byte
		el, v = cutByte(v, ',')
		name, _ := cutByte(trimOWS(el), ';')
		name = trimOWS(name)
		if len(name) == 0 {
			continue
		}
		for _, c := range name {
			if class[c]&cToken == 0 {
				return errReqTE
			}
		}
		if !knownCoding(name) {
			return errReqCoding
		}
	}
	return errReqTE
}

// knownCoding reports a transfer coding in IANA's registry (and the
// identity that RFC 7230 removed from it, which old clients still send).
func knownCoding(name []byte) bool {
	for _, c := range [...]string{"chunked", "gzip", "deflate", "compress", "x-gzip", "x-compress", "identity"} {
		if equalFold(name, c) {
			return true
		}
	}
	return false
}

func cutByte(b []byte, sep byte) (before, after []byte) {
	for i, c := range b {
		if c == sep {
			return b[:i], b[i+1:]
		}
	}
	return b, nil
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// targetFits reports whether target's form fits method (RFC 9112 §3.2):
// "*" for OPTIONS only, the authority form for CONNECT only, else the
// origin form ("/...") or the absolute form with an authority
// (scheme "://" ...), as fasthttp reads it.
func targetFits(method, target []byte) bool {
	switch {
	case string(method) == "CONNECT":
		for _, c := range target {
			if c == '/' || c == '?' || c == '#' {
				return false
			}
		}
		return target[0] != '*'
	case target[0] == '*':
		return len(target) == 1 && string(method) == "OPTIONS"
	case target[0] == '/':
		return true
	}
	// scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ), then "://".
	for i, c := range target {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		case i > 0 && c == ':':
			return len(target) > i+2 && target[i+1] == '/' && target[i+2] == '/'
		default:
			return false
		}
	}
	return false
}

// RequestLen is the length of the request at the start of b once its
// head is complete — head plus Content-Length, which is more than len(b)
// while the body is still coming; 0 while the head is incomplete; -1 for
// a request ParseRequest refuses, or a chunked one, which a relay of
// Content-Length bodies cannot carry (maxHead <= 0 means DefaultMaxHead).
func RequestLen(b []byte, maxHead int) int {
	r, err := ParseRequest(b, Limits{MaxHead: maxHead})
	switch {
	case err != nil || r.Chunked() || r.Length > int64(math.MaxInt-r.HeadEnd):
		return -1
	case !r.Complete():
		return 0
	}
	return r.HeadEnd + int(r.Length) // may be past len(b): the body is still coming
}

// Byte classes, for reading a head one table look-up a byte.
const (
	cToken  = 1 << iota // tchar: a method's or field name's byte
	cValue              // a field value's: VCHAR, obs-text, SP, HTAB
	cTarget             // a request target's: VCHAR, obs-text
)

// class is each byte's classes. It is built once and never written.
var class = func() (t [256]uint8) {
	for c := range 256 {
		b := byte(c)
		if isTchar(b) {
			t[c] |= cToken
		}
		if b > ' ' && b != 0x7f {
			t[c] |= cValue | cTarget
		}
		if b == ' ' || b == '\t' {
			t[c] |= cValue
		}
	}
	return t
}()
