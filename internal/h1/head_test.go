package h1

import (
	"strings"
	"testing"
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
