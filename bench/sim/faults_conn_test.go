package sim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// keepAliveConn is one client TCP connection reused for several HTTP/1.1
// requests, as a pooling client (the router) reuses it: the test sees
// exactly what the server does to the connection between requests.
type keepAliveConn struct {
	conn net.Conn
	br   *bufio.Reader
	addr string
}

func dialKeepAlive(t testing.TB, baseURL string) *keepAliveConn {
	t.Helper()
	addr := strings.TrimPrefix(baseURL, "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &keepAliveConn{conn: c, br: bufio.NewReader(c), addr: addr}
}

// do sends one request (no Connection header: HTTP/1.1 keep-alive) and
// reads the whole response; the body is returned read.
func (k *keepAliveConn) do(t testing.TB, method, path, body string) (*http.Response, string) {
	t.Helper()
	_ = k.conn.SetDeadline(time.Now().Add(20 * time.Second))
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		method, path, k.addr, len(body), body)
	if _, err := io.WriteString(k.conn, req); err != nil {
		t.Fatalf("%s %s: write: %v", method, path, err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		t.Fatalf("%s %s: read response: %v", method, path, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, string(b)
}

// readAfterResponse reads from the idle connection until within passes:
// io.EOF when the server closed it, a timeout when it kept it open.
func (k *keepAliveConn) readAfterResponse(within time.Duration) error {
	_ = k.conn.SetReadDeadline(time.Now().Add(within))
	_, err := k.br.ReadByte()
	if err == nil {
		return errors.New("unexpected bytes after the response")
	}
	return err
}

func TestFaultCloseAfterResponse(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	setFaults(t, u, `{"close_after_response":true}`)
	cases := []struct {
		name, method, path, body string
		status                   int
		wantDone                 bool // an SSE body ending in [DONE]
	}{
		{"chat", "POST", "/v1/chat/completions", smallChat, 200, false},
		{"streamed completion", "POST", "/v1/completions",
			`{"model":"qwen","stream":true,"prompt":"x","max_tokens":5,"ignore_eos":true}`, 200, true},
		{"health", "GET", "/health", "", 200, false},
		{"error", "POST", "/v1/chat/completions", `{"model":"nope","messages":[]}`, 404, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := dialKeepAlive(t, u)
			resp, body := k.do(t, c.method, c.path, c.body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, body, c.status)
			}
			if got := resp.Header.Get("Keep-Alive"); got != "timeout=5, max=100" {
				t.Errorf("Keep-Alive = %q, want llama-server's %q", got, "timeout=5, max=100")
			}
			if got, ok := resp.Header["Connection"]; ok || resp.Close {
				t.Errorf("Connection = %q (close=%v): the server must not announce the close", got, resp.Close)
			}
			if c.wantDone && !strings.HasSuffix(body, "data: [DONE]\n\n") {
				t.Errorf("stream did not end in [DONE]: %q", body)
			}
			if err := k.readAfterResponse(5 * time.Second); err != io.EOF {
				t.Errorf("after the response the connection gave %v, want EOF (closed by the server)", err)
			}
		})
	}

	t.Run("control plane exempt", func(t *testing.T) {
		k := dialKeepAlive(t, u)
		for i := range 2 {
			if resp, body := k.do(t, "GET", "/sim/faults", ""); resp.StatusCode != 200 || resp.Header.Get("Keep-Alive") != "" {
				t.Fatalf("request %d: %d %v %s", i, resp.StatusCode, resp.Header, body)
			}
		}
	})

	t.Run("cleared", func(t *testing.T) {
		setFaults(t, u, `{}`)
		k := dialKeepAlive(t, u)
		for i := range 2 {
			resp, body := k.do(t, "POST", "/v1/chat/completions", smallChat)
			if resp.StatusCode != 200 || resp.Header.Get("Keep-Alive") != "" {
				t.Fatalf("request %d on one connection: %d %v %s", i, resp.StatusCode, resp.Header, body)
			}
		}
	})
}

// With a lag the connection stays open, unread, after the response: a
// request sent in that window is never answered, and the close that ends
// the window reaches its sender as an end or a reset.
func TestFaultCloseLag(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	setFaults(t, u, `{"close_after_response":true,"close_lag_seconds":1}`)
	k := dialKeepAlive(t, u)
	if resp, body := k.do(t, "POST", "/v1/chat/completions", smallChat); resp.StatusCode != 200 {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	start := time.Now()
	if err := k.readAfterResponse(100 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("within the lag the connection gave %v, want it open (a read timeout)", err)
	}
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		k.addr, len(smallChat), smallChat)
	if _, err := io.WriteString(k.conn, req); err != nil {
		t.Fatalf("a write within the lag failed: %v", err)
	}
	err := k.readAfterResponse(5 * time.Second)
	if err == nil || isTimeout(err) {
		t.Fatalf("the request sent within the lag got %v, want the connection closed under it", err)
	}
	// Half the lag: the client reads the response after the lag began.
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Errorf("closed %v after the response, want about the 1 s lag", waited)
	}
}

func TestFaultKeepAliveTimeout(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	setFaults(t, u, `{"keepalive_timeout_seconds":0.2}`)

	// A request in progress is not idle: on a connection that has been
	// idle before, a client that takes longer than the idle timeout to send
	// its body (a large prompt on a slow link) is still answered.
	k := dialKeepAlive(t, u)
	if resp, _ := k.do(t, "GET", "/health", ""); resp.StatusCode != 200 {
		t.Fatalf("/health = %d", resp.StatusCode)
	}
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		k.addr, len(smallChat))
	if _, err := io.WriteString(k.conn, head+smallChat[:10]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the slow client: not synchronisation
	if _, err := io.WriteString(k.conn, smallChat[10:]); err != nil {
		t.Fatalf("the server gave up on a request being sent: %v", err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		t.Fatalf("slow request on a reused connection: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("slow request on a reused connection: %d", resp.StatusCode)
	}
	// Idle, the connection is closed after 0.2 s: well before the 3 s
	// this read waits, and the 5 s default.
	if err := k.readAfterResponse(3 * time.Second); err != io.EOF {
		t.Errorf("idle connection gave %v, want EOF (closed by the server)", err)
	}
}
