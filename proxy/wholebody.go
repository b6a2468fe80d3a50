package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fastjson"
)

// wholeBody is a whole (non-streamed) answer on its way to the client, as
// fasthttp's body stream: fasthttp writes it (WriteTo), which sends it at
// once, and then closes it (CloseWithError), which finishes the exchange —
// the answer's usage read, the metrics, record and access log line written
// (step 7). Done in the handler, before fasthttp wrote the answer, that
// work was part of the client's wait: ~5 µs a request at c=1 (`gpurouter
// bench proxy-cost`). Its zero value is not usable: respondWhole builds it.
type wholeBody struct {
	x      *exchange
	buf    *bytebufferpool.ByteBuffer // the answer; back to the pool on close
	status int
	off    int  // what Read has given
	sent   bool // WriteTo wrote it all and flushed it
	closed bool
	// known: the answer's check found where its top-level usage value is
	// in buf, from usageAt to usageEnd (both 0: it has none); else the
	// answer is scanned for it (wholeUsage). Offsets, not a slice: the
	// struct stays in its 48-byte size class.
	known             bool
	usageAt, usageEnd int32
}

// setUsage notes where the answer's usage value is (nil: none); usage is
// within buf.
func (b *wholeBody) setUsage(usage []byte, known bool) {
	at := cap(b.buf.B) - cap(usage) // usage is a slice of buf.B from there
	if !known || usage == nil || at+len(usage) > math.MaxInt32 {
		b.known = known && usage == nil
		return
	}
	b.known, b.usageAt, b.usageEnd = true, int32(at), int32(at+len(usage))
}

// tokens reads the answer's token counts: where its check noted its
// usage, else by a scan of the answer.
func (b *wholeBody) tokens(s *Server) (prompt, completion int, ok bool) {
	if !b.known {
		return s.wholeUsage(b.buf.B)
	}
	var usage []byte
	if b.usageEnd > 0 {
		usage = b.buf.B[b.usageAt:b.usageEnd]
	}
	return s.usageOf(usage)
}

// WriteTo writes the answer into fasthttp's buffered writer after the
// head, and flushes both, in one write(2) as fasthttp would: the client
// has its answer before CloseWithError runs.
func (b *wholeBody) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(b.buf.B[b.off:])
	b.off += n
	if err == nil {
		if bw, ok := w.(*bufio.Writer); ok {
			err = bw.Flush()
		}
	}
	b.sent = err == nil && b.off == len(b.buf.B)
	return int64(n), err
}

// SupportsBodyWriteTo tells fasthttp to use WriteTo (fasthttp.BodyWriterTo).
func (b *wholeBody) SupportsBodyWriteTo() bool { return true }

// Read is the answer for readers other than fasthttp's writer (a test's
// Response.Body, say).
func (b *wholeBody) Read(p []byte) (int, error) {
	if b.off == len(b.buf.B) {
		b.sent = true
		return 0, io.EOF
	}
	n := copy(p, b.buf.B[b.off:])
	b.off += n
	return n, nil
}

// CloseWithError is called once by fasthttp when it has written the body
// (err: why writing to the client failed) or dropped it unwritten; it
// finishes the exchange.
func (b *wholeBody) CloseWithError(err error) error {
	if b.closed {
		return nil
	}
	b.closed = true
	x := b.x
	if p, c, ok := b.tokens(x.s); ok {
		x.promptTokens, x.completionTokens, x.gotUsage = int32(p), int32(c), true
	}
	bytebufferpool.Put(b.buf)
	b.buf = nil
	var final error
	switch {
	case err != nil:
		final = fmt.Errorf("%w: %v", ErrClientGone, err)
	case !b.sent:
		final = ErrClientGone // closed before it was written, without a write error
	}
	x.finish(final, b.status)
	return nil
}

// wholeUsage reads the token counts of a whole response's top-level
// usage; ok is false when it has none. It reads answers whose check did
// not note where their usage is (not a 200, more members than noted, a
// key with escapes before it: respondWhole); usageOf reads a noted one.
// Only the usage member is parsed: the rest is passed over in its bytes
// (openai.EachMember), so an answer's text and logprobs — thousands of values
// with top_logprobs — build no parse tree. gjson's walk to "usage" took
// 3.7 µs of a 4 KB answer (`bench proxy-cost --reply-bytes 4096`); a
// whole-answer parse, ~1 µs.
func (s *Server) wholeUsage(body []byte) (prompt, completion int, ok bool) {
	// An engine writes usage last or nearly: looked for from the end, it
	// is found within the last few hundred bytes, where a search from the
	// start stops at every "u" of the text before it.
	if strings.LastIndex(openai.BytesView(body), openai.UsageKey) < 0 {
		return 0, 0, false
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return 0, 0, false
	}
	p := s.parsers.Get()
	defer s.parsers.Put(p)
	var usage []byte
	err := openai.EachMember(body, func(key, raw []byte) error {
		if usage == nil && openai.MemberKey(p, key) == "usage" {
			usage = raw // the first, as a parse's Get finds it
		}
		return nil
	})
	if err != nil {
		return 0, 0, false
	}
	return s.usageOfWith(p, usage)
}

// usageOf reads the token counts of a usage value's bytes (nil: none).
func (s *Server) usageOf(usage []byte) (prompt, completion int, ok bool) {
	if usage == nil {
		return 0, 0, false
	}
	p := s.parsers.Get()
	defer s.parsers.Put(p)
	return s.usageOfWith(p, usage)
}

// usageOfWith is usageOf with the parser p, which the caller holds.
func (s *Server) usageOfWith(p *fastjson.Parser, usage []byte) (prompt, completion int, ok bool) {
	if openai.RawType(usage) != fastjson.TypeObject {
		return 0, 0, false
	}
	mp := openai.NewMemberParser(p)
	u, err := mp.Tree("usage", usage)
	if err != nil {
		return 0, 0, false
	}
	return int(openai.IntOf(u.Get("prompt_tokens"))), int(openai.IntOf(u.Get("completion_tokens"))), true
}
