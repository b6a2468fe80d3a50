package proxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// testDoor is a front door with the default limits, its refusals counted
// in a registry of its own.
func testDoor(t *testing.T, edit func(*Config)) *frontDoor {
	t.Helper()
	cfg := Config{}
	if edit != nil {
		edit(&cfg)
	}
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return newFrontDoor(cfg.withDefaults(), serverName, m.refused)
}

// A connection's requests reach fasthttp one at a time, each only once
// its head is whole, however the bytes arrive: a chunked one in
// Content-Length form with its body decoded, empty lines before a request
// dropped.
func TestFrontDoorHandsOnOneCheckedRequestAtATime(t *testing.T) {
	in := chat("") +
		apiHead + "Transfer-Encoding: chunked\r\nX-After: 1\r\n\r\n" + chunks(chatBody, 5, "0\r\nX-Trailer: 1\r\n\r\n") +
		"\r\n" + "GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n"
	for _, step := range []int{1, 3, 64, len(in)} {
		a, b := net.Pipe()
		pc := newPrefetchConn(a, nil, testDoor(t, nil))
		go func() {
			for s := in; len(s) > 0; {
				k := min(step, len(s))
				if _, err := b.Write([]byte(s[:k])); err != nil {
					return
				}
				s = s[k:]
			}
			b.Close()
		}()
		br := bufio.NewReader(pc)
		var got []string
		for range 3 {
			var req fasthttp.Request
			if err := req.Read(br); err != nil {
				t.Fatalf("step %d, request %d: %v", step, len(got)+1, err)
			}
			h := &req.Header
			got = append(got, string(h.Method())+" "+string(h.RequestURI())+" te="+string(h.Peek("Transfer-Encoding"))+
				" cl="+string(h.Peek("Content-Length"))+" after="+string(h.Peek("X-After"))+" body="+string(req.Body()))
		}
		want := []string{
			"POST /v1/chat/completions te= cl=57 after= body=" + chatBody,
			"POST /v1/chat/completions te= cl=57 after=1 body=" + chatBody,
			"GET /v1/models te= cl= after= body=",
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("step %d: fasthttp read\n%s\nwant\n%s", step, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("step %d: after the last request: %v, want EOF", step, err)
		}
		a.Close()
	}
}

// A refused request behind a valid one: fasthttp reads the valid one, and
// then nothing; the client gets the refusal and the connection closes.
func TestFrontDoorRefusalEndsTheReads(t *testing.T) {
	a, b := net.Pipe()
	pc := newPrefetchConn(a, nil, testDoor(t, nil))
	go func() {
		b.Write([]byte(chat("") + "GET / HTTP/1.1\nHost: r\n\n")) //nolint:errcheck
	}()
	br := bufio.NewReader(pc)
	var req fasthttp.Request
	if err := req.Read(br); err != nil {
		t.Fatal(err)
	}
	answer := make(chan string, 1)
	go func() {
		b.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		got, _ := io.ReadAll(b)
		answer <- string(got)
	}()
	if n, err := br.Read(make([]byte, 64)); n != 0 || err == nil {
		t.Fatalf("read past a refused head: %d, %v", n, err)
	}
	if got := <-answer; !strings.HasPrefix(got, "HTTP/1.1 400 Bad Request\r\n") || !strings.Contains(got, "Connection: close\r\n") ||
		!strings.Contains(got, `"code":"malformed_request"`) {
		t.Fatalf("the client got %q", got)
	}
}

// A request not sent within the read timeout from its first byte is
// answered 408 on both paths; a chunked body over the limit 413.
func TestFrontDoorSlowAndLargeRequests(t *testing.T) {
	for _, goroutines := range doorPaths() {
		eng := newRecEngine(t)
		tr := startRouter(t, []string{eng.url}, withConfig(func(c *Config) {
			c.GoroutineRequests, c.RequestLoops = goroutines, 1
			c.ReadTimeout, c.MaxBodyBytes = 300*time.Millisecond, 64
		}))
		addr := strings.TrimPrefix(tr.url, "http://")
		for _, c := range []struct {
			name   string
			in     string
			status int
		}{
			{"head not all sent", apiHead + "X-Slow: 1\r\n", 408},
			{"chunked body not all sent", apiHead + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", 408},
			{"chunked body over the limit", apiHead + "Transfer-Encoding: chunked\r\n\r\n" + chunks(strings.Repeat("x", 65), 10, "0\r\n\r\n"), 413},
		} {
			st, _, closed := rawExchange(t, addr, []byte(c.in), 1, true)
			if len(st) != 1 || st[0] != c.status || !closed {
				t.Errorf("goroutines %v, %s: statuses %v, closed %v; want %d and closed", goroutines, c.name, st, closed, c.status)
			}
		}
		if n := eng.apiRequests(); n != 0 {
			t.Errorf("goroutines %v: the engine got %d requests", goroutines, n)
		}
	}
}

// BenchmarkFrontDoorRead is a request read as fasthttp reads each
// keep-alive one — a one-byte read, then the rest — through the front
// door, over an in-memory conn: the door's own cost on fasthttp's path
// (BenchmarkPrefetchConnRead's, plus the head's check), 0 allocs.
func BenchmarkFrontDoorRead(b *testing.B) {
	req := []byte(chat("Authorization: Bearer sk-0123456789abcdef\r\nUser-Agent: OpenAI/Python 1.54.4\r\n"))
	c := newPrefetchConn(&repeatConn{chunk: req}, nil, &frontDoor{})
	one, rest := make([]byte, 1), make([]byte, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(req)))
	for b.Loop() {
		c.Read(one) //nolint:errcheck
		if n, err := c.Read(rest); n != len(req)-1 || err != nil {
			b.Fatal(n, err)
		}
	}
}
