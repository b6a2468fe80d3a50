package h1

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestReadHead(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\ndate: Fri, 27 Nov 2026 09:00:00 GMT\r\nContent-Type:  application/json \r\nX-Empty:\r\ncontent-length: 2\r\n\r\n"
	h, status, ok := ReadHead([]byte(head))
	if !ok || status != 200 {
		t.Fatalf("ReadHead: status %d, ok %v", status, ok)
	}
	var got []string
	for {
		name, value, ok := h.Next()
		if !ok {
			break
		}
		got = append(got, string(name)+"="+string(value))
	}
	if want := "date=Fri, 27 Nov 2026 09:00:00 GMT|Content-Type=application/json|X-Empty=|content-length=2"; strings.Join(got, "|") != want {
		t.Errorf("fields %q; want %q", strings.Join(got, "|"), want)
	}
	if !h.Ended() {
		t.Error("not ended at the empty line")
	}
	if _, _, ok := h.Next(); ok {
		t.Error("a field after the end")
	}
}

func TestReadHeadRefuses(t *testing.T) {
	for _, head := range []string{
		"HTTP/1.0 200 OK\r\n\r\n",
		"HTTP/1.1 2x0 OK\r\n\r\n",
		"HTTP/1.1 200OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nA: b\r\n", // no empty line
		"HTTP/1.1 200 OK\n\r\n",       // a bare LF
		"",
	} {
		if _, _, ok := ReadHead([]byte(head)); ok {
			t.Errorf("ReadHead(%q) ok", head)
		}
	}
	for _, head := range []string{
		"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
		"HTTP/1.1 200 OK\r\nNo colon\r\n\r\n",
		"HTTP/1.1 200 OK\r\nA : b\r\n\r\n",
		"HTTP/1.1 200 OK\r\nA: b\rc\r\n\r\n",
	} {
		h, _, ok := ReadHead([]byte(head))
		if !ok {
			t.Errorf("ReadHead(%q) refused its status line", head)
			continue
		}
		for {
			if _, _, ok := h.Next(); !ok {
				break
			}
		}
		if h.Ended() {
			t.Errorf("%q: Ended after a line that is no field", head)
		}
	}
	if h, status, ok := ReadHead([]byte("HTTP/1.1 204\r\n\r\n")); !ok || status != 204 {
		t.Errorf("a status line without a reason: status %d, ok %v", status, ok)
	} else if _, _, more := h.Next(); more || !h.Ended() {
		t.Error("a head without fields")
	}
}

// holdHeadToFasthttp is FuzzResponseEnd's check of Head on a response
// ResponseEnd took whole (ferr: fasthttp's reading of it): where fasthttp
// reads a final response's head too, Head reads the same status and, for
// each field fasthttp keeps as it came, the same value (the last of a
// repeated name, as fasthttp's Peek gives it); where fasthttp refuses a
// field's value, ValidValue refuses one — so a relay that writes a head
// from Head's fields (proxy's raw answers) takes no head fasthttp's path
// would refuse.
func holdHeadToFasthttp(t *testing.T, in []byte, ferr error) {
	t.Helper()
	end := bytes.Index(in, []byte("\r\n\r\n"))
	h, status, ok := ReadHead(in[:end+4])
	if !ok {
		t.Fatalf("%q: ResponseEnd took it whole, ReadHead refused its head", in)
	}
	if status < 200 {
		return // an interim response: fasthttp reads past it
	}
	last := map[string]string{}
	valid := true
	for {
		name, value, ok := h.Next()
		if !ok {
			break
		}
		valid = valid && ValidValue(value)
		last[strings.ToLower(string(name))] = string(value)
	}
	if !h.Ended() {
		t.Fatalf("%q: Head stopped before the head's end", in)
	}
	if ferr != nil {
		if strings.Contains(ferr.Error(), "invalid header value") && valid {
			t.Fatalf("%q: fasthttp refused a value (%v), ValidValue took every one", in, ferr)
		}
		return
	}
	if !valid {
		t.Fatalf("%q: fasthttp read every value, ValidValue refused one", in)
	}
	var resp fasthttp.ResponseHeader
	if err := resp.Read(bufio.NewReader(bytes.NewReader(in))); err != nil {
		t.Fatalf("%q: fasthttp read it whole, not its head: %v", in, err)
	}
	if resp.StatusCode() != status {
		t.Fatalf("%q: status %d, fasthttp's %d", in, status, resp.StatusCode())
	}
	for name, value := range last {
		switch name {
		case "content-length", "transfer-encoding", "connection", "set-cookie", "date", "trailer":
			continue // fasthttp keeps these apart, or rewrites them
		case "content-type":
			if value == "" {
				continue // fasthttp's default type then; a relay from Head takes none (proxy's raw answers)
			}
		}
		if got := string(resp.Peek(name)); got != value {
			t.Fatalf("%q: %s is %q, fasthttp's %q", in, name, value, got)
		}
	}
}

func BenchmarkReadHead(b *testing.B) {
	resp, _ := benchResponses()
	head := resp[:bytes.Index(resp, []byte("\r\n\r\n"))+4]
	b.ReportAllocs()
	b.SetBytes(int64(len(head)))
	for b.Loop() {
		h, _, ok := ReadHead(head)
		n := 0
		for {
			_, v, ok := h.Next()
			if !ok {
				break
			}
			if ValidValue(v) {
				n++
			}
		}
		if !ok || n != 4 || !h.Ended() {
			b.Fatalf("%d fields", n)
		}
	}
}
