package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http/httputil"
	"strconv"
	"strings"
	"testing"
)

// decodeAll runs body through a Chunked in pieces of step bytes with a
// dst of room bytes, as reads off a socket would come.
func decodeAll(t *testing.T, body []byte, step, room int) ([]byte, int, error) {
	t.Helper()
	var d Chunked
	var out []byte
	dst := make([]byte, room)
	pos := 0
	for pos < len(body) && !d.Done() {
		end := min(pos+step, len(body))
		src := body[pos:end]
		for len(src) > 0 && !d.Done() {
			n, used, err := d.Decode(dst, src)
			out = append(out, dst[:n]...)
			pos += used
			src = src[used:]
			if err != nil {
				return out, pos, err
			}
			if n == 0 && used == 0 {
				t.Fatalf("decode made no progress at %d", pos)
			}
		}
	}
	if !d.Done() {
		return out, pos, io.ErrUnexpectedEOF
	}
	return out, pos, nil
}

func TestChunkedMatchesTheStandardLibrary(t *testing.T) {
	events := [][]byte{
		[]byte("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"),
		bytes.Repeat([]byte("x"), 5000),
		[]byte("data: [DONE]\n\n"),
	}
	var framed bytes.Buffer
	cw := httputil.NewChunkedWriter(&framed)
	var want []byte
	for _, ev := range events {
		cw.Write(ev) //nolint:errcheck
		want = append(want, ev...)
	}
	cw.Close() //nolint:errcheck
	framed.WriteString("\r\n")
	body := append(framed.Bytes(), "GET / HTTP/1.1\r\n"...) // the next response's bytes stay unread

	for _, step := range []int{1, 2, 3, 7, 64, 1 << 20} {
		for _, room := range []int{1, 5, 4096} {
			got, used, err := decodeAll(t, body, step, room)
			if err != nil {
				t.Fatalf("step %d room %d: %v", step, room, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("step %d room %d: decoded %d bytes, want %d", step, room, len(got), len(want))
			}
			if used != framed.Len() {
				t.Fatalf("step %d room %d: used %d bytes, want the %d of the body", step, room, used, framed.Len())
			}
		}
	}
	// Decoding what we frame with the standard library's reader agrees too.
	got, err := io.ReadAll(httputil.NewChunkedReader(bufio.NewReader(bytes.NewReader(framed.Bytes()))))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("standard reader: %v", err)
	}
}

func TestChunkedExtensionsAndTrailers(t *testing.T) {
	body := []byte("5;name=value\r\nhello\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n")
	got, used, err := decodeAll(t, body, 1, 16)
	if err != nil || string(got) != "hello" || used != len(body) {
		t.Fatalf("got %q used %d err %v", got, used, err)
	}
}

func TestChunkedRefusesBrokenFraming(t *testing.T) {
	for body, want := range map[string]error{
		"\r\n":                      errChunk, // no size
		"zz\r\n":                    errChunk, // not hex
		"5\r\nhello!\r\n":           errChunk, // data longer than its size
		"5\rxhello\r\n":             errChunk, // CR without LF
		"5\r\nhello\rx":             errChunk, // CR without LF after data
		"1111111111111111\r\n":      errChunk, // sixteen digits
		"5 ;ext\r\nhello\r\n":       errChunk, // whitespace before an extension
		"5;ext\nhello\r\n0\r\n\r\n": errChunk, // bare LF
		"5;a\x01b\r\nhello\r\n":     errChunkExt,
		"5;" + strings.Repeat("a", MaxChunkExt+1) + "\r\nhello\r\n":     errChunkExt,
		"0\r\nX: a\x00b\r\n\r\n":                                        errFieldText,
		"0\r\nX a: b\r\n\r\n":                                           errFieldName,
		"0\r\nX: a\r\n b\r\n\r\n":                                       errObsFold,
		"0\r\nX: a\nY: b\r\n\r\n":                                       errLineEnd,
		"0\r\nX: a\r\n\n":                                               errLineEnd,
		"0\r\n" + strings.Repeat("X: y\r\n", DefaultMaxHead/5) + "\r\n": errHeadTooLong,
	} {
		_, _, err := decodeAll(t, []byte(body), 3, 64)
		if err != want || !errors.Is(err, ErrFraming) {
			t.Errorf("%.40q: err %v, want %v", body, err, want)
		}
	}
}

// A refusal is for good: the body cannot be followed past it.
func TestChunkedRefusalSticks(t *testing.T) {
	var d Chunked
	if _, _, err := d.Decode(make([]byte, 8), []byte("x\r\n")); err != errChunk {
		t.Fatalf("err %v", err)
	}
	if n, used, err := d.Decode(make([]byte, 8), []byte("1\r\na\r\n0\r\n\r\n")); n != 0 || used != 0 || err != errChunk {
		t.Fatalf("after the refusal: %d, %d, %v", n, used, err)
	}
}

// BenchmarkChunkedDecode takes the framing off one SSE event per chunk,
// as the stream loop does for each read; ns/op and allocs/op are per
// event.
func BenchmarkChunkedDecode(b *testing.B) {
	ev := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok "}}]}` + "\n\n"
	framed := []byte(strconv.FormatInt(int64(len(ev)), 16) + "\r\n" + ev + "\r\n")
	dst := make([]byte, 4096)
	var d Chunked
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		if n, used, err := d.Decode(dst, framed); err != nil || n != len(ev) || used != len(framed) {
			b.Fatalf("decoded %d of %d bytes: %v", n, used, err)
		}
	}
}
