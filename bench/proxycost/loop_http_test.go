package proxycost

import (
	"strings"
	"testing"
)

func TestRequestLen(t *testing.T) {
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
	for _, tc := range []struct {
		in   string
		want int
	}{
		{head[:20], 0},                                    // head incomplete
		{head, len(head) + 5},                             // body still coming: past len(b)
		{head + "hello", len(head) + 5},                   // whole
		{head + "helloGET / HTTP/1.1\r\n", len(head) + 5}, // the next pipelined behind it
		{"GET / HTTP/1.1\r\nhost: x\r\n\r\n", 27},         // no body
		{strings.Replace(head, "Content-Length", "content-LENGTH", 1) + "hello", len(head) + 5},
		{"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", -1},
		{"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n", -1},
	} {
		if got := requestLen([]byte(tc.in)); got != tc.want {
			t.Errorf("requestLen(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// TestRespEndFindsEachResponsesEnd feeds responses whole and one byte at a
// time: the end is found at the last byte, never before.
func TestRespEndFindsEachResponsesEnd(t *testing.T) {
	for _, resp := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
		"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nA;ext=1\r\n0123456789\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nc8\r\n" + strings.Repeat("x", 200) + "\r\n0\r\nX-Trailer: y\r\n\r\n",
	} {
		var whole respEnd
		if done, err := whole.feed([]byte(resp)); !done || err != nil {
			t.Errorf("whole %q: done %v, err %v", resp, done, err)
		}
		var r respEnd
		for i := range len(resp) {
			done, err := r.feed([]byte{resp[i]})
			if err != nil || done != (i == len(resp)-1) {
				t.Fatalf("%q byte %d of %d: done %v, err %v", resp, i, len(resp), done, err)
			}
		}
	}
	var r respEnd
	if _, err := r.feed([]byte("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc")); err == nil {
		t.Error("a body to the close: want an error (it cannot be kept alive)")
	}
}
