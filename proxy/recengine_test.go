package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// recEngine is a strict engine on a loopback port that records every byte
// it receives, and reads them as RFC 9112 has them — CRLF line ends,
// token field names, one Content-Length, no other framing — answering
// each request it reads with a chat completion. It is the engine behind
// the front door's conformance table: it shows every request the router
// sent, and every byte, so a request the router let through hidden in
// another's bytes shows too.
type recEngine struct {
	t   *testing.T
	url string
	ln  net.Listener
	wg  sync.WaitGroup

	mu       sync.Mutex
	got      []byte     // every byte received, each connection's reads appended as they came
	requests []recvdReq // the requests read, in order
	errs     []string   // what it could not read as a request
	conns    map[net.Conn]struct{}
}

// recvdReq is a request the engine read.
type recvdReq struct {
	line   string   // the request line
	names  []string // its field names, as they came
	fields map[string]string
	body   string
}

func newRecEngine(t *testing.T) *recEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &recEngine{t: t, url: "http://" + ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	e.wg.Go(e.accept)
	t.Cleanup(e.close)
	return e
}

func (e *recEngine) accept() {
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		e.mu.Lock()
		e.conns[c] = struct{}{}
		e.mu.Unlock()
		e.wg.Go(func() { e.serve(c) })
	}
}

// close stops accepting, closes every connection and waits for their
// goroutines.
func (e *recEngine) close() {
	e.ln.Close()
	e.mu.Lock()
	for c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// recorder appends what a connection's reads give to the engine's record.
type recorder struct {
	e *recEngine
	c net.Conn
}

func (r recorder) Read(p []byte) (int, error) {
	n, err := r.c.Read(p)
	r.e.mu.Lock()
	r.e.got = append(r.e.got, p[:n]...)
	r.e.mu.Unlock()
	return n, err
}

// serve reads c's requests one by one and answers each, until c ends or
// holds something that is not a request.
func (e *recEngine) serve(c net.Conn) {
	defer func() {
		e.mu.Lock()
		delete(e.conns, c)
		e.mu.Unlock()
		c.Close()
	}()
	br := bufio.NewReader(recorder{e, c})
	for {
		req, err := readStrict(br)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				e.mu.Lock()
				e.errs = append(e.errs, err.Error())
				e.mu.Unlock()
			}
			return
		}
		e.mu.Lock()
		e.requests = append(e.requests, req)
		e.mu.Unlock()
		body := `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1}}`
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
			return
		}
	}
}

// readStrict reads one request as a strict reader would: anything but
// CRLF line ends, token names and a Content-Length body is an error.
func readStrict(br *bufio.Reader) (recvdReq, error) {
	line := func() (string, error) {
		l, err := br.ReadString('\n')
		if err != nil {
			return "", err
		}
		if !strings.HasSuffix(l, "\r\n") || strings.Contains(l[:len(l)-2], "\r") {
			return "", fmt.Errorf("a line not ended by CRLF: %q", l)
		}
		return l[:len(l)-2], nil
	}
	var r recvdReq
	var err error
	if r.line, err = line(); err != nil {
		return r, err
	}
	r.fields = map[string]string{}
	for {
		l, err := line()
		if err != nil {
			return r, err
		}
		if l == "" {
			break
		}
		name, value, ok := strings.Cut(l, ":")
		if !ok {
			return r, fmt.Errorf("a field line without a colon: %q", l)
		}
		r.names = append(r.names, name)
		r.fields[strings.ToLower(name)] = strings.Trim(value, " \t")
	}
	if _, ok := r.fields["transfer-encoding"]; ok {
		return r, fmt.Errorf("a body framed by Transfer-Encoding: %q", r.line)
	}
	n := 0
	if v, ok := r.fields["content-length"]; ok {
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			return r, fmt.Errorf("Content-Length %q", v)
		}
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return r, err
	}
	r.body = string(body)
	return r, nil
}

// apiRequests is how many API requests (/v1/...) the engine has read.
func (e *recEngine) apiRequests() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, r := range e.requests {
		if strings.Contains(r.line, " /v1/") {
			n++
		}
	}
	return n
}

// lastRequest is the last request the engine read.
func (e *recEngine) lastRequest() recvdReq {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.requests) == 0 {
		return recvdReq{}
	}
	return e.requests[len(e.requests)-1]
}

// check fails t if the engine met bytes it could not read as requests,
// bytes marked as a hidden request's, or a field name that is not a
// token.
func (e *recEngine) check(t *testing.T, hiddenMark string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, err := range e.errs {
		t.Errorf("the engine could not read what the router sent: %s", err)
	}
	if bytes.Contains(bytes.ToLower(e.got), []byte(strings.ToLower(hiddenMark))) {
		t.Errorf("a hidden request's bytes reached the engine: %q", e.got)
	}
	for _, r := range e.requests {
		for _, name := range r.names {
			if !isToken(name) {
				t.Errorf("field name %q, not a token, reached the engine in %q", name, r.line)
			}
		}
	}
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// rawExchange writes in on a fresh connection to addr and reads the
// answers, up to want of them: their statuses (a 1xx counts), the body of
// the last, and, when asked (askClosed), whether the router then closed
// the connection.
func rawExchange(t *testing.T, addr string, in []byte, want int, askClosed bool) (statuses []int, last string, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
	if _, err := c.Write(in); err != nil {
		t.Fatalf("write: %v", err)
	}
	br := bufio.NewReader(c)
	for len(statuses) < want {
		st, body, err := readResponse(br)
		if err != nil {
			break
		}
		statuses, last = append(statuses, st), body
	}
	if !askClosed {
		return statuses, last, false
	}
	// Closed: the next read ends at once, with EOF or a reset (the router
	// closes as soon as its answer is out). Open: it waits, and a short
	// deadline ends it.
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond)) //nolint:errcheck
	_, err = br.ReadByte()
	var ne net.Error
	closed = err != nil && !(errors.As(err, &ne) && ne.Timeout())
	return statuses, last, closed
}

// readResponse reads one response by Content-Length (the router frames
// its whole answers so).
func readResponse(br *bufio.Reader) (status int, body string, err error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return 0, "", err
	}
	f := strings.Fields(line)
	if len(f) < 2 || !strings.HasPrefix(f[0], "HTTP/1.") {
		return 0, "", fmt.Errorf("status line %q", line)
	}
	if status, err = strconv.Atoi(f[1]); err != nil {
		return 0, "", err
	}
	n := 0
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return 0, "", err
		}
		l = strings.TrimRight(l, "\r\n")
		if l == "" {
			break
		}
		if name, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(name, "content-length") {
			n, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return 0, "", err
	}
	return status, string(b), nil
}
