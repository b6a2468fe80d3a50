package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// endCase is a stream of upstream bytes and the verdict on it: the
// response ends at end (the stream may go on past it), or it is refused
// with err, or (end -1, err nil) it is not complete.
type endCase struct {
	name string
	in   string
	end  int
	err  error
}

const ok200 = "HTTP/1.1 200 OK\r\n"

func endCases() []endCase {
	cl := ok200 + "Content-Type: text/plain\r\nContent-Length: 3\r\n\r\nabc"
	chunked := ok200 + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nA;ext=1;q=\"a b\"\r\n0123456789\r\n0\r\n\r\n"
	trailers := ok200 + "transfer-encoding: CHUNKED\r\n\r\nc8\r\n" + strings.Repeat("x", 200) + "\r\n0 \r\nX-Trailer: y\r\nX-Other:\r\n\r\n"
	n304 := "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n"
	tab := ok200 + "Transfer-Encoding: chunked\r\n\r\n3\t\r\nabc\r\n0\t\r\n\r\n"
	ctl := ok200 + "X: a\x00b\r\nContent-Length: 0\r\n\r\n"
	trailerCL := ok200 + "Transfer-Encoding: chunked\r\n\r\n0\r\nContent-Length: 5\r\n\r\n"
	cont := "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + cl
	return []endCase{
		{"content-length", cl, len(cl), nil},
		{"content-length 0", ok200 + "content-length: 0\r\n\r\n", len(ok200) + 21, nil},
		{"length with whitespace", ok200 + "Content-Length:\t 3  \r\n\r\nabc", len(ok200) + 27, nil},
		{"no reason phrase", "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", 35, nil},
		{"bytes past the end", cl + "HTTP/1.1 200 OK\r\n", len(cl), nil},
		{"chunked, extensions", chunked, len(chunked), nil},
		{"chunked, trailers", trailers, len(trailers), nil},
		{"chunked, bytes past the end", chunked + "x", len(chunked), nil},
		{"204 without a length", "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1", 27, nil},
		{"304 with a length", n304 + "0123456789", len(n304), nil},
		{"204 chunked", "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n", 55, nil},
		{"interim responses", cont, len(cont), nil},
		{"chunk size, tab", tab, len(tab), nil},
		{"control byte in a value", ctl, len(ctl), nil},         // fasthttp refuses
		{"length in a trailer", trailerCL, len(trailerCL), nil}, // fasthttp refuses

		{"head incomplete", cl[:30], -1, nil},
		{"body incomplete", cl[:len(cl)-1], -1, nil},
		{"last chunk incomplete", chunked[:len(chunked)-2], -1, nil},
		{"chunk CRLF incomplete", chunked[:len(ok200)+38], -1, nil},
		{"interim only", "HTTP/1.1 100 Continue\r\n\r\n", -1, nil},

		{"no length", ok200 + "Connection: close\r\n\r\nabc", 0, errNoLength},
		{"101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", 0, errUpgrade},
		{"both lengths", ok200 + "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 0, errBothLengths},
		{"length twice", ok200 + "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 0, errLength},
		{"signed length", ok200 + "Content-Length: +3\r\n\r\nabc", 0, errLength},
		{"length list", ok200 + "Content-Length: 3, 3\r\n\r\nabc", 0, errLength},
		{"empty length", ok200 + "Content-Length:\r\n\r\n", 0, errLength},
		{"huge length", ok200 + "Content-Length: 1234567890123456789\r\n\r\n", 0, errLength},
		{"gzip", ok200 + "Transfer-Encoding: gzip\r\n\r\n", 0, errTransferEncoding},
		{"gzip, chunked", ok200 + "Transfer-Encoding: gzip, chunked\r\n\r\n", 0, errTransferEncoding},
		{"chunked twice", ok200 + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 0, errTransferEncoding},
		{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", 0, errHTTP10},
		{"HTTP/1.0 bad status", "HTTP/1.0 2x0 OK\r\nContent-Length: 0\r\n\r\n", 0, errStatusLine},
		{"two-digit status", "HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n", 0, errStatusLine},
		{"blank line first", "\r\n" + cl, 0, errStatusLine},
		{"lone LF", ok200 + "Content-Length: 0\n\r\n", 0, errLineEnd},
		{"lone LF ending the head", ok200 + "Content-Length: 0\r\n\n", 0, errLineEnd},
		{"lone CR", ok200 + "X: a\rContent-Length: 1\r\nContent-Length: 0\r\n\r\n", 0, errLineEnd},
		{"folded", ok200 + "X: a\r\n b\r\nContent-Length: 0\r\n\r\n", 0, errObsFold},
		{"space before colon", ok200 + "Content-Length : 3\r\n\r\nabc", 0, errFieldName},
		{"no colon", ok200 + "Content-Length 3\r\n\r\nabc", 0, errFieldName},
		{"chunk without CRLF", ok200 + "Transfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n", 0, errChunk},
		{"chunk size not hex", ok200 + "Transfer-Encoding: chunked\r\n\r\nx\r\n", 0, errChunk},
		{"chunk size empty", ok200 + "Transfer-Encoding: chunked\r\n\r\n;a\r\n", 0, errChunk},
		{"chunk size, LF", ok200 + "Transfer-Encoding: chunked\r\n\r\n3\nabc\r\n", 0, errChunk},
		{"chunk size split", ok200 + "Transfer-Encoding: chunked\r\n\r\n1 0\r\n", 0, errChunk},
		{"space before extension", ok200 + "Transfer-Encoding: chunked\r\n\r\n3 ;a\r\nabc\r\n", 0, errChunk},
		{"LF in extension", ok200 + "Transfer-Encoding: chunked\r\n\r\n3;a\nabc\r\n", 0, errChunk},
		{"16 hex digits", ok200 + "Transfer-Encoding: chunked\r\n\r\n0000000000000003\r\nabc\r\n", 0, errChunk},
		{"trailer without colon", ok200 + "Transfer-Encoding: chunked\r\n\r\n0\r\nX\r\n\r\n", 0, errFieldName},
		{"head over the limit", ok200 + "X: " + strings.Repeat("y", DefaultMaxHead) + "\r\nContent-Length: 0\r\n\r\n", 0, errHeadTooLong},
		{"head line over the limit", ok200 + "X: " + strings.Repeat("y", DefaultMaxHead), 0, errHeadTooLong},
		{"trailers over the limit", ok200 + "Transfer-Encoding: chunked\r\n\r\n0\r\nX: " + strings.Repeat("y", DefaultMaxHead) + "\r\n\r\n", 0, errHeadTooLong},
	}
}

// check holds what a run of Feeds ended with to c's verdict.
func (c endCase) check(t *testing.T, how string, n int, done bool, err error) {
	t.Helper()
	switch {
	case c.err != nil:
		if err != c.err || done {
			t.Errorf("%s, %s: done %v, err %v; want err %v", c.name, how, done, err, c.err)
		}
	case c.end < 0:
		if done || err != nil {
			t.Errorf("%s, %s: done %v, err %v; want neither", c.name, how, done, err)
		}
	default:
		if !done || err != nil || n != c.end {
			t.Errorf("%s, %s: n %d, done %v, err %v; want done at %d", c.name, how, n, done, err, c.end)
		}
	}
}

// TestResponseEnd feeds each stream whole, split in two at every byte,
// and one byte at a time: the verdict is the same however the bytes
// arrive.
func TestResponseEnd(t *testing.T) {
	for _, c := range endCases() {
		in := []byte(c.in)
		var r ResponseEnd
		n, done, err := r.Feed(in)
		c.check(t, "whole", n, done, err)
		if !errors.Is(err, ErrFraming) && err != nil {
			t.Errorf("%s: %v does not wrap ErrFraming", c.name, err)
		}
		step := 1
		if len(in) > 1<<10 {
			step = 251 // the limit cases: every byte would take minutes
		}
		for at := 0; at <= len(in); at += step {
			r.Reset()
			n, done, err := r.Feed(in[:at])
			if !done && err == nil {
				var m int
				m, done, err = r.Feed(in[at:])
				n += m
			}
			c.check(t, "split at "+strconv.Itoa(at), n, done, err)
		}
		r.Reset()
		n, done, err = 0, false, nil
		for i := 0; i < len(in) && !done && err == nil; i++ {
			var m int
			m, done, err = r.Feed(in[i : i+1])
			n += m
		}
		c.check(t, "byte by byte", n, done, err)
	}
}

func TestResponseEndAfterTheEnd(t *testing.T) {
	var r ResponseEnd
	resp := ok200 + "Content-Length: 1\r\n\r\nx"
	if n, done, err := r.Feed([]byte(resp + "yz")); n != len(resp) || !done || err != nil {
		t.Fatalf("Feed = %d, %v, %v; want %d, true, nil", n, done, err, len(resp))
	}
	if n, done, err := r.Feed([]byte("more")); n != 0 || !done || err != nil {
		t.Errorf("Feed when done = %d, %v, %v; want 0, true, nil", n, done, err)
	}
	r.Reset()
	if n, done, err := r.Feed([]byte("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")); n != 0 || done || err != errNoLength {
		t.Fatalf("Feed = %d, %v, %v; want 0, false, errNoLength", n, done, err)
	}
	if n, done, err := r.Feed([]byte(resp)); n != 0 || done || err != errNoLength {
		t.Errorf("Feed after an error = %d, %v, %v; want the error again", n, done, err)
	}
	r.Reset()
	if _, done, err := r.Feed([]byte(resp)); !done || err != nil {
		t.Errorf("Feed after Reset = %v, %v; want done", done, err)
	}
}

func TestResponseEndMaxHead(t *testing.T) {
	resp := ok200 + "Content-Length: 0\r\n\r\n"
	r := ResponseEnd{MaxHead: len(resp)}
	if _, done, err := r.Feed([]byte(resp)); !done || err != nil {
		t.Errorf("a head of MaxHead bytes: done %v, err %v", done, err)
	}
	r.MaxHead--
	r.Reset()
	if _, _, err := r.Feed([]byte(resp)); err != errHeadTooLong {
		t.Errorf("a head over MaxHead: err %v, want errHeadTooLong", err)
	}
	if r.MaxHead != len(resp)-1 {
		t.Errorf("Reset changed MaxHead to %d", r.MaxHead)
	}
}

func TestNoAllocations(t *testing.T) {
	resp, chunked := benchResponses()
	var r ResponseEnd
	if a := testing.AllocsPerRun(100, func() {
		r.Reset()
		r.Feed(resp)
		r.Reset()
		r.Feed(chunked)
	}); a != 0 {
		t.Errorf("%v allocations per run, want 0", a)
	}
}

// fasthttpEnd is where fasthttp finds the end of the response at the
// start of in: k bytes, or err.
func fasthttpEnd(in []byte) (k int, err error) {
	rd := bytes.NewReader(in)
	br := bufio.NewReaderSize(rd, len(in)+1) // never too small for a head
	var resp fasthttp.Response
	if err := resp.ReadLimitBody(br, 1<<20); err != nil {
		return 0, err
	}
	return len(in) - rd.Len() - br.Buffered(), nil
}

// truncated reports whether fasthttp failed for want of more bytes.
func truncated(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	// ErrBrokenChunk hides what it wraps from errors.Is; its messages end
	// with what it wraps.
	var bc fasthttp.ErrBrokenChunk
	return errors.As(err, &bc) && strings.HasSuffix(bc.Error(), "EOF")
}

// stricter is what ResponseEnd refuses by design where fasthttp reads on
// (a lone LF as a line end, leading blank lines, folding, whitespace
// before a colon, both lengths, HTTP/1.0, a body to the close, 101, a
// chunk extension over its bound or with a control character, a control
// character in a trailer value).
var stricter = []error{errHeadTooLong, errStatusLine, errLineEnd, errObsFold, errFieldName, errBothLengths, errNoLength, errHTTP10, errUpgrade, errChunkExt, errFieldText}

// laxer is what fasthttp refuses and ResponseEnd lets through by design:
// field values it does not read, trailer names no framing depends on.
var laxer = []string{"invalid header value", "invalid trailer value", "forbidden trailer key"}

// FuzzResponseEnd holds ResponseEnd to fasthttp's reading of the same
// bytes, fed whole and split in two:
//   - however the bytes are split, the verdict is the same;
//   - where fasthttp reads a response of k bytes, ResponseEnd is done at
//     exactly k, or refuses it for one of the stricter reasons;
//   - where ResponseEnd is done, fasthttp read a response of the same
//     length, or refused it for one of the laxer reasons — never for
//     want of bytes, nor over its framing.
func FuzzResponseEnd(f *testing.F) {
	for _, c := range endCases() {
		if len(c.in) < 1<<10 {
			f.Add([]byte(c.in), uint16(len(c.in)/2))
		}
	}
	resp, chunked := benchResponses()
	f.Add(resp, uint16(100))
	f.Add(chunked, uint16(300))
	f.Fuzz(func(t *testing.T, in []byte, split uint16) {
		if len(in) <= 1<<15 {
			holdToFasthttp(t, in, int(split))
		}
	})
}

// TestEveryByteAgainstFasthttp holds ResponseEnd to fasthttp as
// FuzzResponseEnd does, over every single-byte change to a few
// responses: each byte value in each place (a status digit, a field
// name, a chunk-size line, a CRLF) — the neighbourhood where readers
// part ways, walked exhaustively rather than by chance.
func TestEveryByteAgainstFasthttp(t *testing.T) {
	if testing.Short() {
		t.Skip("about 150,000 responses")
	}
	for _, c := range endCases() {
		switch c.name {
		case "content-length", "chunked, extensions", "chunked, trailers", "interim responses":
		default:
			continue
		}
		in := []byte(c.in)
		for i := range in {
			orig := in[i]
			for v := range 256 {
				in[i] = byte(v)
				holdToFasthttp(t, in, i)
			}
			in[i] = orig
		}
	}
}

// holdToFasthttp is FuzzResponseEnd's check of one input, split at split
// (modulo its length).
func holdToFasthttp(t *testing.T, in []byte, split int) {
	t.Helper()
	var r ResponseEnd
	n, done, err := r.Feed(in)
	at := split % (len(in) + 1)
	r.Reset()
	n2, done2, err2 := r.Feed(in[:at])
	if !done2 && err2 == nil {
		var m int
		m, done2, err2 = r.Feed(in[at:])
		n2 += m
	}
	if err2 != err || done2 != done || err == nil && n2 != n { // n is 0 on an error
		t.Fatalf("%q: whole: %d, %v, %v; split at %d: %d, %v, %v", in, n, done, err, at, n2, done2, err2)
	}
	k, ferr := fasthttpEnd(in)
	if done {
		holdHeadToFasthttp(t, in, ferr)
	}
	switch {
	case ferr == nil && done:
		if n != k {
			t.Fatalf("%q: done at %d, fasthttp at %d", in, n, k)
		}
	case ferr == nil:
		if !isOneOf(err, stricter) {
			t.Fatalf("%q: fasthttp read %d bytes; done %v, err %v", in, k, done, err)
		}
	case done:
		if truncated(ferr) || !containsOneOf(ferr.Error(), laxer) {
			t.Fatalf("%q: done at %d; fasthttp: %v", in, n, ferr)
		}
	}
}

func isOneOf(err error, errs []error) bool {
	for _, e := range errs {
		if err == e {
			return true
		}
	}
	return false
}

func containsOneOf(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// benchResponses are a chat completion of about 650 bytes as an
// upstream sends it, by Content-Length and as an event stream in chunks.
func benchResponses() (resp, chunked []byte) {
	body := `{"id":"chatcmpl-8f2c1e","object":"chat.completion","created":1718000000,"model":"meta-llama/Llama-3.1-8B-Instruct",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"The quick brown fox jumps over the lazy dog. ` +
		`The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog."},` +
		`"logprobs":null,"finish_reason":"stop","stop_reason":null}],` +
		`"usage":{"prompt_tokens":27,"total_tokens":63,"completion_tokens":36},"prompt_logprobs":null}`
	head := "HTTP/1.1 200 OK\r\ndate: Mon, 10 Jun 2024 06:13:20 GMT\r\nserver: uvicorn\r\n" +
		"content-type: application/json\r\ncontent-length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	resp = []byte(head + body)
	var b strings.Builder
	b.WriteString("HTTP/1.1 200 OK\r\ndate: Mon, 10 Jun 2024 06:13:20 GMT\r\nserver: uvicorn\r\n" +
		"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n")
	for _, w := range []string{"The", " quick", " brown", " fox", " jumps"} {
		ev := `data: {"id":"chatcmpl-8f2c1e","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + w + `"}}]}` + "\n\n"
		b.WriteString(strconv.FormatInt(int64(len(ev)), 16) + "\r\n" + ev + "\r\n")
	}
	b.WriteString("e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
	return resp, []byte(b.String())
}

func BenchmarkResponseEnd(b *testing.B) {
	resp, chunked := benchResponses()
	for _, bc := range []struct {
		name string
		in   []byte
	}{{"content-length", resp}, {"chunked", chunked}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.in)))
			var r ResponseEnd
			for b.Loop() {
				r.Reset()
				if _, done, err := r.Feed(bc.in); !done || err != nil {
					b.Fatal(done, err)
				}
			}
		})
	}
}

// The responses a relay may read to the close instead of refusing are
// told apart (ErrToClose); the broken ones are not among them.
func TestResponseEndToClose(t *testing.T) {
	for in, want := range map[string]bool{
		"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{}": true,
		"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{}":              true,
		"hello there\r\n\r\n": false,
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n": false,
	} {
		var r ResponseEnd
		_, _, err := r.Feed([]byte(in))
		if !errors.Is(err, ErrFraming) || errors.Is(err, ErrToClose) != want {
			t.Errorf("%q: %v; want ErrToClose %v", in, err, want)
		}
	}
}
