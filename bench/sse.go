package bench

import (
	"bytes"
	"errors"
	"io"
)

// chunkKind is what one SSE line means to the load generator.
type chunkKind uint8

const (
	chunkOther chunkKind = iota // not a data line, or a data chunk with no token (role-only, usage-only, empty content)
	chunkToken                  // a chunk that carries output: the timestamps of these are TTFT and ITL
	chunkDone                   // data: [DONE]
	chunkError                  // data: {"error": …}, vLLM's in-stream failure
)

// chunk is the light parse of one SSE line. Usage fields are -1 when the
// line carries no usage object.
type chunk struct {
	kind             chunkKind
	completionTokens int
	promptTokens     int
}

// parseSSELine classifies one SSE line (without its line ending) with byte
// searches only: no JSON decoding and no allocation, because it runs once
// per streamed event. A data payload is a token chunk when a "content",
// "text", "reasoning_content" or "reasoning" key holds a non-empty string
// (DESIGN.md: TTFT is the first chunk carrying content); with anyChoice set,
// every chunk with a non-empty "choices" array counts, which is what vllm
// bench literally does (its role-only first chunk and empty final chunk
// count as tokens too). Raw JSON cannot contain an unescaped quote inside a
// string, so a key pattern like `"content"` never matches inside a value.
func parseSSELine(line []byte, anyChoice bool) chunk {
	c := chunk{completionTokens: -1, promptTokens: -1}
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if !bytes.HasPrefix(line, []byte("data:")) {
		return c
	}
	p := bytes.TrimSpace(line[len("data:"):])
	if len(p) == 0 {
		return c
	}
	if p[0] != '{' {
		if bytes.Equal(p, []byte("[DONE]")) {
			c.kind = chunkDone
		}
		return c
	}
	if isErrorPayload(p) {
		c.kind = chunkError
		return c
	}
	if anyChoice {
		if v := valueAfterKey(p, []byte(`"choices"`)); len(v) > 1 && v[0] == '[' && firstNonSpace(v[1:]) != ']' {
			c.kind = chunkToken
		}
	} else if hasNonEmptyString(p, []byte(`"content"`)) || hasNonEmptyString(p, []byte(`"text"`)) ||
		hasNonEmptyString(p, []byte(`"reasoning_content"`)) || hasNonEmptyString(p, []byte(`"reasoning"`)) {
		c.kind = chunkToken
	}
	if u := valueAfterKey(p, []byte(`"usage"`)); len(u) > 0 && u[0] == '{' {
		c.completionTokens = intAfterKey(u, []byte(`"completion_tokens"`))
		c.promptTokens = intAfterKey(u, []byte(`"prompt_tokens"`))
	}
	return c
}

// isErrorPayload recognises vLLM's error forms: {"error": {...}} (v0.10.1+)
// and the older flat {"object": "error", ...}.
func isErrorPayload(p []byte) bool {
	if bytes.HasPrefix(firstAfterBrace(p), []byte(`"error"`)) {
		v := valueAfterKey(p, []byte(`"error"`))
		return len(v) > 0 && v[0] != 'n' // not "error": null
	}
	v := valueAfterKey(p, []byte(`"object"`))
	return bytes.HasPrefix(v, []byte(`"error"`))
}

func firstAfterBrace(p []byte) []byte {
	return bytes.TrimLeft(p[1:], " \t\r\n")
}

func firstNonSpace(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// valueAfterKey returns p from the value of the first occurrence of key
// (quoted) that is followed by a colon, or nil.
func valueAfterKey(p, key []byte) []byte {
	for {
		i := bytes.Index(p, key)
		if i < 0 {
			return nil
		}
		p = p[i+len(key):]
		rest := bytes.TrimLeft(p, " \t")
		if len(rest) > 0 && rest[0] == ':' {
			return bytes.TrimLeft(rest[1:], " \t")
		}
	}
}

// hasNonEmptyString reports whether some occurrence of key holds a string
// value other than "".
func hasNonEmptyString(p, key []byte) bool {
	for {
		i := bytes.Index(p, key)
		if i < 0 {
			return false
		}
		p = p[i+len(key):]
		rest := bytes.TrimLeft(p, " \t")
		if len(rest) < 3 || rest[0] != ':' {
			continue
		}
		rest = bytes.TrimLeft(rest[1:], " \t")
		if len(rest) >= 2 && rest[0] == '"' && rest[1] != '"' {
			return true
		}
	}
}

// intAfterKey returns the non-negative integer value of key in p, or -1.
func intAfterKey(p, key []byte) int {
	v := valueAfterKey(p, key)
	n, digits := 0, 0
	for _, b := range v {
		if b < '0' || b > '9' {
			break
		}
		if n > (1<<31)/10 {
			return -1
		}
		n = n*10 + int(b-'0')
		digits++
	}
	if digits == 0 {
		return -1
	}
	return n
}

// errLineTooLong is returned by lineReader for a line over its limit.
var errLineTooLong = errors.New("bench: SSE line too long")

// lineReader splits a byte stream into lines without copying them out: the
// returned slice aliases its buffer and is valid until the next call. The
// buffer starts small (a vLLM chunk is a few hundred bytes) and grows up to
// max for long lines. The zero value is not usable; use newLineReader.
type lineReader struct {
	r          io.Reader
	buf        []byte
	start, end int
	max        int
	err        error
	empties    int // consecutive (0, nil) reads
}

func newLineReader(r io.Reader, buf []byte, max int) *lineReader {
	return &lineReader{r: r, buf: buf[:cap(buf)], max: max}
}

// reset points the reader at a new stream, keeping its buffer.
func (lr *lineReader) reset(r io.Reader) {
	lr.r, lr.start, lr.end, lr.err, lr.empties = r, 0, 0, nil, 0
}

// next returns the next line without its '\n'. At the end of the stream it
// returns the reader's error (io.EOF for a clean end); an unterminated last
// line is dropped, since a half-received event means nothing.
func (lr *lineReader) next() ([]byte, error) {
	for {
		if i := bytes.IndexByte(lr.buf[lr.start:lr.end], '\n'); i >= 0 {
			line := lr.buf[lr.start : lr.start+i]
			lr.start += i + 1
			return line, nil
		}
		if lr.err != nil {
			return nil, lr.err
		}
		if lr.start > 0 {
			lr.end = copy(lr.buf, lr.buf[lr.start:lr.end])
			lr.start = 0
		}
		if lr.end == len(lr.buf) {
			if len(lr.buf) >= lr.max {
				lr.err = errLineTooLong
				return nil, lr.err
			}
			nb := make([]byte, min(2*len(lr.buf)+1, lr.max))
			copy(nb, lr.buf[:lr.end])
			lr.buf = nb
		}
		n, err := lr.r.Read(lr.buf[lr.end:])
		lr.end += n
		switch {
		case err != nil:
			lr.err = err
		case n > 0:
			lr.empties = 0
		default:
			// io.Reader allows an occasional (0, nil); many in a row would
			// spin, so give up as bufio does.
			if lr.empties++; lr.empties >= 100 {
				lr.err = io.ErrNoProgress
			}
		}
	}
}
