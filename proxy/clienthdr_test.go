package proxy

import (
	"bufio"
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// The one pass finds what a lookup each finds (RequestHeader.Peek): the
// first of each header, whatever case the client wrote its name in, with
// other headers and repeats around it.
func TestClientHeadersMatchPeek(t *testing.T) {
	names := []string{"X-Request-Id", "Authorization", "X-Gpurouter-Policy", "X-Session-Id", headerPriority,
		headerTenant, headerTimeout, headerSLOTTFT, headerSLOTPOT, "X-Other", "Content-Type", "User-Agent"}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		var head strings.Builder
		head.WriteString("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n")
		for j := range rng.IntN(12) {
			n := names[rng.IntN(len(names))]
			switch rng.IntN(3) {
			case 0:
				n = strings.ToLower(n)
			case 1:
				n = strings.ToUpper(n)
			}
			v := ""
			if rng.IntN(5) > 0 {
				v = "v" + string(rune('a'+j))
			}
			head.WriteString(n + ": " + v + "\r\n")
		}
		head.WriteString("Content-Length: 0\r\n\r\n")
		var h fasthttp.RequestHeader
		if err := h.Read(bufio.NewReader(strings.NewReader(head.String()))); err != nil {
			t.Fatalf("case %d: %v\n%s", i, err, head.String())
		}
		c := readClientHeaders(&h)
		for name, got := range map[string][]byte{
			"X-Request-Id": c.requestID, "Authorization": c.authorization, "X-Gpurouter-Policy": c.policy,
			"X-Session-Id": c.session, headerPriority: c.priority, headerTenant: c.tenant, headerTimeout: c.timeout,
			headerSLOTTFT: c.sloTTFT, headerSLOTPOT: c.sloTPOT,
		} {
			if want := h.Peek(name); !bytes.Equal(got, want) {
				t.Fatalf("case %d: %s = %q, Peek %q\n%s", i, name, got, want, head.String())
			}
		}
	}
}

func BenchmarkReadClientHeaders(b *testing.B) {
	var h fasthttp.RequestHeader
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-0123456789abcdef\r\n" +
		"User-Agent: OpenAI/Python 1.54.0\r\nX-Stainless-Lang: python\r\nAccept: application/json\r\nContent-Length: 300\r\n\r\n"
	if err := h.Read(bufio.NewReader(strings.NewReader(head))); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		c := readClientHeaders(&h)
		if c.authorization == nil {
			b.Fatal("no Authorization")
		}
	}
}
