//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/internal/netloop"
	"github.com/gpurouter/gpurouter/internal/netloop/looptest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// lockstepEngine answers each request with a chat completion naming the
// request's X-Request-Id, and holds every answer until n requests are in:
// then it writes them all, back to back, so that the router's loop finds
// the engine's n answers ready together.
func lockstepEngine(t *testing.T, n int) string {
	type held struct {
		c  net.Conn
		id string
	}
	var (
		mu   sync.Mutex
		hold []held
	)
	answer := func(id string) string {
		content := "ok"
		if strings.HasSuffix(id, "-long") {
			content = strings.Repeat("long answer ", 3000) // past a batch's read slot
		}
		body := `{"id":"` + id + `","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` + content + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	return loopbackServer(t, func(c net.Conn) {
		enginePosts(c, func(req *http.Request) bool {
			mu.Lock()
			hold = append(hold, held{c, req.Header.Get("X-Request-Id")})
			var out []held
			if len(hold) == n {
				out, hold = hold, nil
			}
			mu.Unlock()
			for _, h := range out {
				io.WriteString(h.c, answer(h.id)) //nolint:errcheck
			}
			return true
		})
	})
}

// Requests and answers that reach a loop together are read in one batch
// and written in one: each client gets its own answer, whole, on every
// round — a third of them long requests and answers, past a batch's read
// slot.
func TestRequestLoopBatchesRequestsReadyTogether(t *testing.T) {
	skipWithoutRing(t)
	const clients = 12
	tr := startRouter(t, []string{lockstepEngine(t, clients)}, oneLoop)
	l := tr.srv.reqLoops[0]
	conns := make([]net.Conn, clients)
	readers := make([]*bufio.Reader, clients)
	for i := range conns {
		c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second)) //nolint:errcheck
		conns[i], readers[i] = c, bufio.NewReader(c)
	}
	round := func(r int) {
		var wg sync.WaitGroup
		errs := make(chan string, clients)
		for i, c := range conns {
			wg.Go(func() {
				id, body := "c"+strconv.Itoa(i)+"-r"+strconv.Itoa(r), chatPlain
				if i%3 == 0 {
					id, body = id+"-long", `{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("a long prompt ", 3000)+`"}]}`
				}
				req := "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nX-Request-Id: " + id +
					"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
				if _, err := io.WriteString(c, req); err != nil {
					errs <- id + ": " + err.Error()
					return
				}
				resp, err := http.ReadResponse(readers[i], nil)
				if err != nil {
					errs <- id + ": " + err.Error()
					return
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != id || !bytes.Contains(got, []byte(`"id":"`+id+`"`)) ||
					strings.HasSuffix(id, "-long") != (len(got) > 30000) {
					errs <- id + ": answered " + resp.Status + " " + resp.Header.Get("X-Request-Id") + " " + string(trim(got))
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	// The engine's answers come together every round; the clients'
	// requests when the goroutines happen to send them together.
	for r := 0; r < 40 && (testutil.ToFloat64(l.s.m.requestReads) == 0 || testutil.ToFloat64(l.s.m.requestWrites) == 0 || r < 5); r++ {
		round(r)
	}
	if testutil.ToFloat64(l.s.m.requestReads) == 0 || testutil.ToFloat64(l.s.m.requestWrites) == 0 {
		t.Fatalf("%v reads and %v writes batched in 40 rounds of %d clients; want some of each", testutil.ToFloat64(l.s.m.requestReads), testutil.ToFloat64(l.s.m.requestWrites), clients)
	}
}

// A write kept for the batch's writes goes out as one made at once would:
// in order with what follows it on its socket, the rest waiting for
// EPOLLOUT when the socket takes less, the connection closed when it
// fails. A client that may have another request in the batch — a read of
// it still to come, or one pipelined — is written at once, since a
// request handed off would take its kept bytes with it.
func TestRequestLoopKeptWrites(t *testing.T) {
	skipWithoutRing(t)
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: Config{}.withDefaults(), now: time.Now, m: m}
	l := newRequestLoop(s, nil)
	if err := l.open(); err != nil {
		t.Fatal(err)
	}
	l.host.openBatch()
	l.openReads()
	t.Cleanup(func() { l.host.closeBatch(); unix.Close(l.ep); unix.Close(l.wake) })
	l.now = time.Now()
	conn := func() (*loopConn, int) {
		a, b := looptest.SocketPair(t)
		fd, err := unix.Dup(a) // the loop closes its own on failure
		if err != nil {
			t.Fatal(err)
		}
		c := &loopConn{fd: fd}
		l.conns.Set(fd, c)
		unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(fd)}) //nolint:errcheck
		return c, b
	}
	peerHas := func(fd int, want string) {
		t.Helper()
		if got := readFor(fd, len(want)); string(got) != want {
			t.Fatalf("the peer read %q (%d bytes), want %q (%d bytes)", trim(got), len(got), trim([]byte(want)), len(want))
		}
	}
	write := func(c *loopConn, p string) {
		t.Helper()
		w := loopWriter{l: l, c: c}
		if n, err := w.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write: %d, %v", n, err)
		}
	}

	plain, plainPeer := conn()
	reading, readingPeer := conn()
	reading.reading = true
	pipelined, pipelinedPeer := conn()
	pipelined.keep([]byte("POST /next"))
	engine, enginePeer := conn()
	engine.up, engine.reading = &upstream{}, true // an engine's read to come is no hand-off
	full, fullPeer := conn()
	// A client gone: a socket whose peer is closed (a Unix pair's, which
	// fails a write with EPIPE at once, as TCP does once its reset is in).
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(pair[1])
	gone := &loopConn{fd: pair[0]}
	l.conns.Set(pair[0], gone)

	// The full client's socket takes nothing more.
	filler := bytes.Repeat([]byte("f"), 64<<10)
	var filled int
	for i := 0; i < 10000; i++ {
		n, err := netloop.Write(full.fd, filler)
		if err == unix.EAGAIN {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		filled += n
	}

	l.reads.taking = true
	write(plain, "answer one,")
	write(plain, " and two") // after kept bytes: appended, in order
	write(reading, "written at once")
	write(pipelined, "written at once too")
	write(engine, "POST /v1/chat/completions")
	write(full, strings.Repeat("k", 1000))
	write(gone, "to nobody")
	if !plain.batched || !engine.batched || !full.batched || !gone.batched || reading.batched || pipelined.batched {
		t.Fatalf("kept: plain %v engine %v full %v gone %v, reading %v pipelined %v; want the first four",
			plain.batched, engine.batched, full.batched, gone.batched, reading.batched, pipelined.batched)
	}
	peerHas(readingPeer, "written at once")
	peerHas(pipelinedPeer, "written at once too")

	l.flushWrites()
	if n := testutil.ToFloat64(l.s.m.requestWrites); n != 4 {
		t.Errorf("%v writes batched, want 4", n)
	}

	peerHas(plainPeer, "answer one, and two")
	peerHas(enginePeer, "POST /v1/chat/completions")
	if plain.out != nil || plain.batched || engine.out != nil {
		t.Errorf("written whole, yet %q and %q wait", plain.out, engine.out)
	}
	if gone.fd != -1 || l.conns.Get(plain.fd) != plain {
		t.Errorf("the gone client's descriptor %d (want closed), the others' kept: %v", gone.fd, l.conns.Get(plain.fd) == plain)
	}
	if len(full.out) != 1000 {
		t.Fatalf("%d bytes wait for the full client, want 1000", len(full.out))
	}
	// The next batch's kept bytes take the same memory: the rest waiting
	// must not be in it.
	l.reads.taking = true
	write(plain, strings.Repeat("z", 1000))
	write(engine, "POST again")
	l.flushWrites()
	peerHas(plainPeer, strings.Repeat("z", 1000))
	peerHas(enginePeer, "POST again")
	// Once its peer reads, EPOLLOUT's write (writable) sends the rest.
	want := strings.Repeat("f", filled) + strings.Repeat("k", 1000)
	got := make(chan []byte, 1)
	go func() { got <- readFor(fullPeer, len(want)) }()
	for end := time.Now().Add(5 * time.Second); len(full.out) > 0 && time.Now().Before(end); time.Sleep(time.Millisecond) {
		l.writable(full)
	}
	if b := <-got; string(b) != want || len(full.out) != 0 {
		t.Fatalf("the full client's peer read %d bytes (%q), want %d; %d bytes still wait", len(b), trim(b), len(want), len(full.out))
	}
}

// readFor reads fd (non-blocking) until it has n bytes, the peer ends, or
// 5 s pass.
func readFor(fd, n int) []byte {
	got := make([]byte, 0, n)
	buf := make([]byte, 64<<10)
	for end := time.Now().Add(5 * time.Second); len(got) < n && time.Now().Before(end); {
		m, err := netloop.Read(fd, buf)
		if err == unix.EAGAIN {
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil || m == 0 {
			break
		}
		got = append(got, buf[:m]...)
	}
	return got
}

func trim(b []byte) []byte {
	if len(b) > 64 {
		return append(append(b[:30:30], "..."...), b[len(b)-30:]...)
	}
	return b
}

// A request pipelined behind an answer its client's socket has not taken
// whole waits for that answer to go out before it is served: one the loop
// hands off (here a GET of the router's own) would take the connection,
// and the answer's rest with it.
func TestRequestLoopServesNextRequestOnceTheAnswerIsOut(t *testing.T) {
	body := `{"id":"big","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("x", 24<<20) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	answer := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	engine := loopbackServer(t, func(c net.Conn) {
		enginePosts(c, func(*http.Request) bool {
			_, err := io.WriteString(c, answer)
			return err == nil
		})
	})
	tr := startRouter(t, []string{engine}, oneLoop)
	c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second)) //nolint:errcheck
	post := "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nX-Request-Id: first\r\nContent-Length: " +
		strconv.Itoa(len(chatPlain)) + "\r\n\r\n" + chatPlain
	if _, err := io.WriteString(c, post); err != nil {
		t.Fatal(err)
	}
	// The answer fills the client's socket while the client reads
	// nothing; then the next request comes, one the loop hands off.
	time.Sleep(300 * time.Millisecond)
	if _, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	br := bufio.NewReaderSize(c, 1<<20)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || string(got) != body {
		t.Fatalf("first answer: %s, %d of %d bytes, %v", resp.Status, len(got), len(body), err)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the models list after it: %v", err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(got, []byte(`"object":"list"`)) {
		t.Fatalf("the models list: %s %s", resp.Status, trim(got))
	}
}
