package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http/httputil"
	"strconv"
	"testing"
)

// decodeAll runs body through a chunkDecoder in pieces of step bytes with a
// dst of room bytes, as reads off a socket would come.
func decodeAll(t *testing.T, body []byte, step, room int) ([]byte, int, error) {
	t.Helper()
	var d chunkDecoder
	var out []byte
	dst := make([]byte, room)
	pos := 0
	for pos < len(body) && !d.done() {
		end := min(pos+step, len(body))
		src := body[pos:end]
		for len(src) > 0 && !d.done() {
			n, used, err := d.decode(dst, src)
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
	if !d.done() {
		return out, pos, io.ErrUnexpectedEOF
	}
	return out, pos, nil
}

func TestChunkDecoderMatchesTheStandardLibrary(t *testing.T) {
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

func TestChunkDecoderExtensionsAndTrailers(t *testing.T) {
	body := []byte("5;name=value\r\nhello\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n")
	got, used, err := decodeAll(t, body, 1, 16)
	if err != nil || string(got) != "hello" || used != len(body) {
		t.Fatalf("got %q used %d err %v", got, used, err)
	}
}

func TestChunkDecoderRejectsBrokenFraming(t *testing.T) {
	for _, body := range []string{
		"\r\n",                      // no size
		"zz\r\n",                    // not hex
		"5\r\nhello!\r\n",           // data longer than its size
		"5\rxhello\r\n",             // CR without LF
		"5\r\nhello\rx",             // CR without LF after data
		"11111111111111111\r\n",     // seventeen digits
		"5;ext\nhello\r\n0\r\n\r\n", // bare LF
	} {
		_, _, err := decodeAll(t, []byte(body), 3, 64)
		if !errors.Is(err, errChunked) || !errors.Is(err, ErrUpstream) {
			t.Errorf("%q: err %v, want errChunked", body, err)
		}
	}
}

// BenchmarkChunkDecode takes the framing off one SSE event per chunk, as
// the stream loop does for each read; ns/op and allocs/op are per event.
func BenchmarkChunkDecode(b *testing.B) {
	ev := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok "}}]}` + "\n\n"
	framed := []byte(strconv.FormatInt(int64(len(ev)), 16) + "\r\n" + ev + "\r\n")
	dst := make([]byte, 4096)
	var d chunkDecoder
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		if n, used, err := d.decode(dst, framed); err != nil || n != len(ev) || used != len(framed) {
			b.Fatalf("decoded %d of %d bytes: %v", n, used, err)
		}
	}
}
