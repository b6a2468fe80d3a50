package h1

import (
	"bufio"
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// reqCase is a request's bytes and ParseRequest's verdict on them: the
// head ends at end with a body of length (-1: chunked), or it is refused
// with an error wrapping err, or (end 0, err nil) it is not all in.
type reqCase struct {
	name   string
	in     string
	end    int
	length int64
	err    error
}

const post = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"

func reqCases() []reqCase {
	cl := post + "Content-Length: 5\r\n\r\n"
	te := post + "Transfer-Encoding: chunked\r\n\r\n"
	many := "GET / HTTP/1.1\r\n" + strings.Repeat("X: y\r\n", DefaultMaxFields-1) + "Host: x\r\n\r\n"
	return []reqCase{
		{"content-length", cl + "hello", len(cl), 5, nil},
		{"chunked", te + "5\r\nhello\r\n0\r\n\r\n", len(te), -1, nil},
		{"chunked, any case, OWS", post + "transfer-encoding:\t CHUNKED \t\r\n\r\n", len(post) + 33, -1, nil},
		{"no body", "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 36, 0, nil},
		{"HTTP/1.0, no fields", "GET / HTTP/1.0\r\n\r\n", 18, 0, nil},
		{"HTTP/1.0 with a length", "POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}", 38, 2, nil},
		{"empty lines first", "\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", 31, 0, nil},
		{"absolute form", "GET http://x/v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 44, 0, nil},
		{"asterisk for OPTIONS", "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 31, 0, nil},
		{"authority for CONNECT", "CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n", 39, 0, nil},
		{"empty value, obs-text", "GET / HTTP/1.1\r\nHost: x\r\nX:\r\nY: caf\xc3\xa9\r\n\r\n", 41, 0, nil},
		{"length with leading zeros", post + "Content-Length: 007\r\n\r\n", len(post) + 23, 7, nil},
		{"fields at the bound", many, len(many), 0, nil},

		{"head incomplete", cl[:30], 0, 0, nil},
		{"a CR alone so far", "\r", 0, 0, nil},
		{"line end incomplete", "GET / HTTP/1.1\r", 0, 0, nil},
		{"field incomplete", "GET / HTTP/1.1\r\nContent-Le", 0, 0, nil},
		{"value incomplete", "GET / HTTP/1.1\r\nX: a\r", 0, 0, nil},

		{"CL then TE", post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 0, errReqBoth},
		{"TE then CL", post + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 0, 0, errReqBoth},
		{"CL, TE padded by tabs", post + "Content-Length: 5\r\nTransfer-Encoding:\t\tchunked\t\r\n\r\n", 0, 0, errReqBoth},
		{"CL, TE folded", post + "Content-Length: 5\r\nTransfer-Encoding:\r\n chunked\r\n\r\n", 0, 0, errReqTE},
		{"TE folded", post + "Transfer-Encoding: x\r\n chunked\r\n\r\n", 0, 0, errReqCoding},
		{"TE chunked, chunked", post + "Transfer-Encoding: chunked, chunked\r\n\r\n", 0, 0, errReqTE},
		{"TE twice", post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 0, errReqTE},
		{"TE gzip, chunked", post + "Transfer-Encoding: gzip, chunked\r\n\r\n", 0, 0, errReqTE},
		{"TE identity", post + "Transfer-Encoding: identity\r\n\r\n", 0, 0, errReqTE},
		{"TE empty", post + "Transfer-Encoding:\r\n\r\n", 0, 0, errReqTE},
		{"TE chunked with a parameter", post + "Transfer-Encoding: chunked;q=1\r\n\r\n", 0, 0, errReqTE},
		{"TE unknown", post + "Transfer-Encoding: foo\r\n\r\n", 0, 0, errReqCoding},
		{"TE unknown, chunked", post + "Transfer-Encoding: x-foo, chunked\r\n\r\n", 0, 0, errReqCoding},
		{"TE in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 0, errReqTE10},
		{"space before colon", post + "Transfer-Encoding : chunked\r\n\r\n", 0, 0, errReqName},
		{"space in a name", post + "Content Length: 5\r\n\r\nhello", 0, 0, errReqName},
		{"name not a token", post + "X Bad: 1\r\n\r\n", 0, 0, errReqName},
		{"name with a slash", post + "X/Y: 1\r\n\r\n", 0, 0, errReqName},
		{"empty name", post + ": 1\r\n\r\n", 0, 0, errReqName},
		{"no colon", post + "X-Y\r\n\r\n", 0, 0, errReqName},
		{"CL +5", post + "Content-Length: +5\r\n\r\nhello", 0, 0, errReqLength},
		{"CL 5, 5", post + "Content-Length: 5, 5\r\n\r\nhello", 0, 0, errReqLength},
		{"CL twice", post + "Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello", 0, 0, errReqLength},
		{"CL negative", post + "Content-Length: -1\r\n\r\n", 0, 0, errReqLength},
		{"CL overflowing", post + "Content-Length: 99999999999999999999\r\n\r\n", 0, 0, errReqLength},
		{"CL empty", post + "Content-Length:\r\n\r\n", 0, 0, errReqLength},
		{"CL hex", post + "Content-Length: 0x5\r\n\r\n", 0, 0, errReqLength},
		{"NUL in a value", post + "X: a\x00b\r\n\r\n", 0, 0, errReqValue},
		{"control in a value", post + "X: a\x01b\r\n\r\n", 0, 0, errReqValue},
		{"DEL in a value", post + "X: a\x7fb\r\n\r\n", 0, 0, errReqValue},
		{"bare CR in a value", post + "X: a\rContent-Length: 5\r\n\r\n", 0, 0, errReqLineEnd},
		{"bare LF ends a field", post + "X: a\nContent-Length: 5\r\n\r\n", 0, 0, errReqLineEnd},
		{"bare LF ends the head", post + "X: a\r\n\n", 0, 0, errReqLineEnd},
		{"bare LF everywhere", "GET / HTTP/1.1\nHost: x\n\n", 0, 0, errReqLineEnd},
		{"bare LF, first line only", "GET / HTTP/1.1\n", 0, 0, errReqLineEnd},
		{"bare CR ends the request line", "GET / HTTP/1.1\rHost: x\r\n\r\n", 0, 0, errReqLineEnd},
		{"bare LF before the request line", "\nGET / HTTP/1.1\r\n\r\n", 0, 0, errReqLineEnd},
		{"obs-fold", post + "X: a\r\n b\r\n\r\n", 0, 0, errReqFold},
		{"tab-fold", post + "X: a\r\n\tb\r\n\r\n", 0, 0, errReqFold},
		{"whitespace before the first field", "GET / HTTP/1.1\r\n Host: x\r\n\r\n", 0, 0, errReqFold},
		{"fields over the bound", "GET / HTTP/1.1\r\nHost: x\r\n" + strings.Repeat("X: y\r\n", DefaultMaxFields) + "\r\n", 0, 0, errReqTooMany},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", 0, 0, errReqHost},
		{"two Hosts", post + "Host: y\r\n\r\n", 0, 0, errReqHost},
		{"empty Host", "GET / HTTP/1.1\r\nHost: \r\n\r\n", 0, 0, errReqHost},
		{"head over the bound", "GET / HTTP/1.1\r\nX: " + strings.Repeat("y", DefaultMaxHead) + "\r\n\r\n", 0, 0, errReqTooLong},
		{"request line over the bound", "GET /" + strings.Repeat("y", DefaultMaxHead), 0, 0, errReqTooLong},
		{"HTTP/0.9", "GET /\r\n", 0, 0, errReqTarget},
		{"HTTP/0.9 with a version", "GET / HTTP/0.9\r\n\r\n", 0, 0, errReqVersion},
		{"HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", 0, 0, errReqVersion},
		{"HTTP/1.2", "GET / HTTP/1.2\r\n\r\n", 0, 0, errReqVersion},
		{"HTTP/1.10", "GET / HTTP/1.10\r\n\r\n", 0, 0, errReqLine},
		{"lowercase version", "GET / http/1.1\r\n\r\n", 0, 0, errReqLine},
		{"no version", "GET / \r\n\r\n", 0, 0, errReqLine},
		{"two spaces after the method", "GET  / HTTP/1.1\r\n\r\n", 0, 0, errReqTarget},
		{"two spaces after the target", "GET /  HTTP/1.1\r\n\r\n", 0, 0, errReqLine},
		{"space at the line's end", "GET / HTTP/1.1 \r\n\r\n", 0, 0, errReqLine},
		{"tab as a separator", "GET\t/ HTTP/1.1\r\n\r\n", 0, 0, errReqLine},
		{"space first", " GET / HTTP/1.1\r\n\r\n", 0, 0, errReqLine},
		{"method not a token", "G(T / HTTP/1.1\r\n\r\n", 0, 0, errReqLine},
		{"control in the target", "GET /a\x01b HTTP/1.1\r\n\r\n", 0, 0, errReqTarget},
		{"DEL in the target", "GET /a\x7fb HTTP/1.1\r\n\r\n", 0, 0, errReqTarget},
		{"asterisk for GET", "GET * HTTP/1.1\r\n\r\n", 0, 0, errReqTarget},
		{"target without a form", "GET v1/models HTTP/1.1\r\n\r\n", 0, 0, errReqTarget},
		{"absolute form without an authority", "GET http:x HTTP/1.1\r\nHost: x\r\n\r\n", 0, 0, errReqTarget},
		{"CONNECT with a path", "CONNECT /x HTTP/1.1\r\n\r\n", 0, 0, errReqTarget},
		{"binary", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 0, 0, errReqLine},
	}
}

func (c reqCase) check(t *testing.T, how string, r Request, err error) {
	t.Helper()
	switch {
	case c.err != nil:
		if err != c.err {
			t.Errorf("%s, %s: %+v, %v; want %v", c.name, how, r, err, c.err)
		}
	case c.end == 0:
		if err != nil || r.Complete() {
			t.Errorf("%s, %s: %+v, %v; want incomplete", c.name, how, r, err)
		}
	default:
		if err != nil || r.HeadEnd != c.end || r.Length != c.length {
			t.Errorf("%s, %s: %+v, %v; want the head to end at %d, length %d", c.name, how, r, err, c.end, c.length)
		}
	}
}

// TestParseRequest reads each case whole, split in two at every byte
// (RequestScan), and one byte at a time: the verdict is the same however
// the bytes arrive, and every refusal says how to answer.
func TestParseRequest(t *testing.T) {
	for _, c := range reqCases() {
		in := []byte(c.in)
		r, err := ParseRequest(in, Limits{})
		c.check(t, "whole", r, err)
		if err != nil && !isRefusal(err) {
			t.Errorf("%s: %v wraps none of the refusals", c.name, err)
		}
		step := 1
		if len(in) > 1<<10 {
			step = 251
		}
		for at := 0; at <= len(in); at += step {
			var s RequestScan
			if _, err := s.Scan(in[:at], Limits{}); err == nil {
				r, err = s.Scan(in, Limits{})
			}
			c.check(t, "split at "+strconv.Itoa(at), r, err)
		}
		if len(in) <= 1<<10 {
			var s RequestScan
			for i := 1; i <= len(in); i++ {
				if r, err = s.Scan(in[:i], Limits{}); err != nil || r.Complete() {
					break
				}
			}
			c.check(t, "byte by byte", r, err)
		}
	}
}

func isRefusal(err error) bool {
	n := 0
	for _, e := range []error{ErrMalformed, ErrHeadTooLarge, ErrUnknownCoding, ErrVersion} {
		if errors.Is(err, e) {
			n++
		}
	}
	return n == 1
}

// A bare-LF head is refused at its first line, not left waiting for a
// CRLF that is never coming: the client gets its 400 at once.
func TestParseRequestRefusesBareLFPromptly(t *testing.T) {
	_, err := ParseRequest([]byte("POST /v1/chat/completions HTTP/1.1\n"), Limits{})
	if err != errReqLineEnd {
		t.Fatalf("err %v, want errReqLineEnd", err)
	}
}

func TestParseRequestLimits(t *testing.T) {
	head := "GET / HTTP/1.1\r\nA: 1\r\nHost: x\r\n\r\n"
	if r, err := ParseRequest([]byte(head), Limits{MaxHead: len(head), MaxFields: 2}); err != nil || r.HeadEnd != len(head) {
		t.Errorf("at the bounds: %+v, %v", r, err)
	}
	if _, err := ParseRequest([]byte(head), Limits{MaxHead: len(head) - 1}); err != errReqTooLong {
		t.Errorf("a byte over MaxHead: %v", err)
	}
	if _, err := ParseRequest([]byte(head), Limits{MaxFields: 1}); err != errReqTooMany {
		t.Errorf("a field over MaxFields: %v", err)
	}
	// A rule broken within the bound is named, not the size.
	if _, err := ParseRequest([]byte("GET / HTTP/1.1\nX: "+strings.Repeat("y", 100)), Limits{MaxHead: 50}); err != errReqLineEnd {
		t.Errorf("a bare LF in a long head: %v", err)
	}
}

func TestRequestLen(t *testing.T) {
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
	long := "GET / HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("y", 100) + "\r\n\r\n"
	for _, tc := range []struct {
		in      string
		maxHead int
		want    int
	}{
		{head[:20], 0, 0},                                    // head incomplete
		{head, 0, len(head) + 5},                             // body still coming: past len(b)
		{head + "hello", 0, len(head) + 5},                   // whole
		{head + "helloGET / HTTP/1.1\r\n", 0, len(head) + 5}, // the next pipelined behind it
		{"GET / HTTP/1.1\r\nhost: x\r\n\r\n", 0, 27},         // no body
		{"GET / HTTP/1.0\r\n\r\n", 0, 18},                    // no fields
		{strings.Replace(head, "Content-Length: 5", "content-LENGTH:\t5 ", 1) + "hello", 0, len(head) + 6},
		{"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 0, -1},
		{"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 0, -1},
		{"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 0, -1},
		{"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 0, -1},
		{"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 0, -1},
		{"POST / HTTP/1.1\r\nContent-Length : 1\r\n\r\n", 0, -1},
		{"POST / HTTP/1.1\r\nX: y\nContent-Length: 1\r\n\r\n", 0, -1}, // a lone LF
		{"POST / HTTP/1.1\r\nX: y\r\n folded\r\n\r\n", 0, -1},
		{"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 0, -1},
		{long, len(long), len(long)},
		{long, len(long) - 1, -1},            // complete, but over the limit
		{long[:60], 50, -1},                  // incomplete and already over it
		{strings.Repeat("x", 70<<10), 0, -1}, // over DefaultMaxHead
	} {
		if got := RequestLen([]byte(tc.in), tc.maxHead); got != tc.want {
			t.Errorf("RequestLen(%.80q, %d) = %d, want %d", tc.in, tc.maxHead, got, tc.want)
		}
	}
}

// fasthttpRequest is how fasthttp reads the request at the start of in:
// where its head ends, its body's Content-Length (-1 chunked), and, when
// the body is all in, its length decoded and where the request ends.
func fasthttpRequest(in []byte) (headEnd, length, bodyLen, end int, err error) {
	rd := bytes.NewReader(in)
	br := bufio.NewReaderSize(rd, len(in)+16)
	var req fasthttp.Request
	if err := req.Header.Read(br); err != nil {
		return 0, 0, 0, 0, err
	}
	headEnd = len(in) - rd.Len() - br.Buffered()
	length = req.Header.ContentLength()
	if err := req.ContinueReadBody(br, 1<<20); err != nil {
		return headEnd, length, -1, -1, nil
	}
	return headEnd, length, len(req.Body()), len(in) - rd.Len() - br.Buffered(), nil
}

// holdRequestToFasthttp is FuzzParseRequest's check of one input: the
// verdict does not depend on how the bytes arrive, and a request the
// grammar accepts is one fasthttp reads alike — the same head end, the
// same length, and for a body all in, the same bytes decoded to the same
// end (a chunked body through Chunked), or a chunked body Chunked
// refuses by design.
func holdRequestToFasthttp(t *testing.T, in []byte, split int) {
	t.Helper()
	r, err := ParseRequest(in, Limits{})
	at := split % (len(in) + 1)
	var s RequestScan
	r2, err2 := s.Scan(in[:at], Limits{})
	if err2 == nil {
		r2, err2 = s.Scan(in, Limits{})
	}
	if r2 != r || err2 != err {
		t.Fatalf("%q: whole: %+v, %v; split at %d: %+v, %v", in, r, err, at, r2, err2)
	}
	if err != nil {
		if !isRefusal(err) {
			t.Fatalf("%q: %v wraps none of the refusals", in, err)
		}
		return
	}
	if !r.Complete() {
		return
	}
	req := in[r.Start:]
	headEnd, length, bodyLen, end, ferr := fasthttpRequest(req)
	if ferr != nil {
		t.Fatalf("%q: accepted (%+v); fasthttp: %v", in, r, ferr)
	}
	wantLen := int(r.Length)
	if headEnd != r.HeadEnd-r.Start || length != wantLen && !(r.Length == 0 && length == -2) {
		t.Fatalf("%q: head ends at %d, length %d; fasthttp: %d, %d", in, r.HeadEnd-r.Start, r.Length, headEnd, length)
	}
	body := in[r.HeadEnd:]
	if !r.Chunked() {
		if len(body) >= wantLen && (bodyLen != wantLen || end != headEnd+wantLen) {
			t.Fatalf("%q: a body of %d; fasthttp read %d, to %d", in, wantLen, bodyLen, end)
		}
		return
	}
	var d Chunked
	dst := make([]byte, len(body))
	n, used, derr := d.Decode(dst, body)
	switch {
	case derr == nil && d.Done():
		if bodyLen != n || end != headEnd+used {
			t.Fatalf("%q: a chunked body of %d to %d; fasthttp read %d, to %d", in, n, r.HeadEnd+used, bodyLen, end+r.Start)
		}
	case derr != nil && bodyLen >= 0:
		if !isOneOf(derr, stricter) {
			t.Fatalf("%q: chunked body refused (%v); fasthttp read %d", in, derr, bodyLen)
		}
	}
}

// FuzzParseRequest holds the request grammar to fasthttp's reading of
// what it accepts (holdRequestToFasthttp): fasthttp, behind the front
// door, never frames an accepted request otherwise.
func FuzzParseRequest(f *testing.F) {
	for _, c := range reqCases() {
		if len(c.in) < 1<<10 {
			f.Add([]byte(c.in), uint16(len(c.in)/2))
		}
	}
	f.Add(benchRequest(), uint16(200))
	f.Fuzz(func(t *testing.T, in []byte, split uint16) {
		if len(in) <= 1<<15 {
			holdRequestToFasthttp(t, in, int(split))
		}
	})
}

// TestEveryRequestByteAgainstFasthttp walks every single-byte change to
// a few requests, as TestEveryByteAgainstFasthttp does for responses.
func TestEveryRequestByteAgainstFasthttp(t *testing.T) {
	if testing.Short() {
		t.Skip("about 60,000 requests")
	}
	for _, in := range [][]byte{
		[]byte(post + "Content-Length: 5\r\n\r\nhello"),
		[]byte(post + "Transfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nT: 1\r\n\r\n"),
	} {
		for i := range in {
			orig := in[i]
			for v := range 256 {
				in[i] = byte(v)
				holdRequestToFasthttp(t, in, i)
			}
			in[i] = orig
		}
	}
}

// benchRequest is a chat completion request as the OpenAI Python client
// sends it.
func benchRequest() []byte {
	body := `{"messages":[{"role":"user","content":"Say hello."}],"model":"meta-llama/Llama-3.1-8B-Instruct","max_tokens":64}`
	return []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept-Encoding: gzip, deflate\r\n" +
		"Connection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n" +
		"User-Agent: OpenAI/Python 1.54.4\r\nX-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.54.4\r\n" +
		"X-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\nX-Stainless-Runtime: CPython\r\n" +
		"X-Stainless-Runtime-Version: 3.11.10\r\nAuthorization: Bearer sk-0123456789abcdef0123456789abcdef\r\n" +
		"X-Stainless-Async: false\r\nx-stainless-retry-count: 0\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

func TestParseRequestAllocatesNothing(t *testing.T) {
	req := benchRequest()
	if a := testing.AllocsPerRun(100, func() {
		if _, err := ParseRequest(req, Limits{}); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("%v allocations per request, want 0", a)
	}
}

// BenchmarkParseRequest is the request loop's check of each request's
// head: one pass, no allocation.
func BenchmarkParseRequest(b *testing.B) {
	req := benchRequest()
	b.ReportAllocs()
	b.SetBytes(int64(bytes.Index(req, []byte("\r\n\r\n")) + 4))
	for b.Loop() {
		if r, err := ParseRequest(req, Limits{}); err != nil || !r.Complete() {
			b.Fatal(r, err)
		}
	}
}
