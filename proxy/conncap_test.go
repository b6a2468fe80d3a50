package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// One cap per replica across both request paths: with
// upstream.max_conns_per_replica at 1, a stream holds the replica's one
// connection — relayed by a request loop, or by a stream loop after
// fasthttp's client gave it up — and a request the goroutine path serves
// meanwhile (HTTP/1.0: a loop hands it off) finds none, where each path,
// and each stream taken from fasthttp, had a cap of its own. Once the
// stream ends, the next request has it.
func TestConnectionCapIsOnePerReplica(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens = 2
	up.lockstep = make(chan int)
	tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) { c.MaxConnsPerReplica = 1 }))
	u, _ := tr.srv.routes.Load().upstream(tr.reps[0])

	resp := post(t, tr.url+"/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		if strings.Contains(line, "tok0") {
			break
		}
	}
	if n := u.cap.open(); n != 1 {
		t.Fatalf("%d connections to the replica during the stream; want 1", n)
	}

	st, body := postHTTP10(t, tr.url, chatPlain)
	if st != http.StatusBadGateway || !strings.Contains(body, "no free connection") {
		t.Fatalf("a request while the stream holds the replica's one connection: %d %s; want 502, no free connection", st, body)
	}
	if n := u.cap.open(); n != 1 {
		t.Fatalf("%d connections to the replica; want 1", n)
	}

	up.lockstep <- 0
	up.lockstep <- 1
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("stream's end: %q", rest)
	}
	waitFor(t, "the stream finished", func() bool { return tr.srv.Active() == 0 })
	if st, _, b := call(t, tr.url, chatPlain); st != 200 {
		t.Fatalf("after the stream: %d %.200s", st, b)
	}
	if st, b := postHTTP10(t, tr.url, chatPlain); st != 200 {
		t.Fatalf("HTTP/1.0 after the stream: %d %.200s", st, b)
	}
	if n := u.cap.open(); n > 1 {
		t.Fatalf("%d connections to the replica; want at most 1", n)
	}
}

// postHTTP10 posts body to the router's chat endpoint as an HTTP/1.0
// client, on a connection of its own: the status and body of the answer.
func postHTTP10(t *testing.T, url, body string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))                                                                          //nolint:errcheck
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.0\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: "+ //nolint:errcheck
		strconv.Itoa(len(body))+"\r\n\r\n"+body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
