//go:build linux

package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/internal/netloop"
	"github.com/gpurouter/gpurouter/internal/netloop/looptest"
	"github.com/gpurouter/gpurouter/internal/openai"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"
)

// tickedUpstream is an engine whose streams send their events together:
// each stream's next event goes out at the next tick, so that the
// router's loop finds several streams ready at one wake-up. Each stream
// sends events token events of pad bytes each, then [DONE].
type tickedUpstream struct {
	url    string
	mu     sync.Mutex
	next   chan struct{}
	events int
	pad    int
}

func newTickedUpstream(t *testing.T, events, pad int) *tickedUpstream {
	u := &tickedUpstream{next: make(chan struct{}), events: events, pad: pad}
	u.url = loopbackServer(t, func(c net.Conn) {
		engineConn(c, func() bool {
			if _, err := io.WriteString(c, sseHead); err != nil {
				return false
			}
			for i := range u.events {
				<-u.tick()
				ev := tokenEvent(i)
				if u.pad > 0 {
					ev = strings.Replace(ev, `"model":"m"`, `"model":"m","pad":"`+strings.Repeat("p", u.pad)+`"`, 1)
				}
				if _, err := io.WriteString(c, chunk(ev)); err != nil {
					return false
				}
			}
			_, err := io.WriteString(c, chunk("data: [DONE]\n\n")+"0\r\n\r\n")
			return err == nil
		})
	})
	return u
}

// tick is the channel the next tick closes.
func (u *tickedUpstream) tick() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.next
}

// run ticks every d until stop closes.
func (u *tickedUpstream) run(d time.Duration, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(d):
		}
		u.mu.Lock()
		close(u.next)
		u.next = make(chan struct{})
		u.mu.Unlock()
	}
}

// batchedOps is the reads and writes the router's loops made in batches:
// its request loops' and its stream loops' (the streams served on
// fasthttp's path).
func batchedOps(tr *testRouter) int64 {
	return int64(testutil.ToFloat64(tr.srv.m.streamReads) + testutil.ToFloat64(tr.srv.m.streamWrites))
}

// readStream reads a stream's token events from r: their numbers in
// order, and whether [DONE] ended it.
func readStream(r io.Reader) (toks []string, done bool, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
			switch {
			case p == "[DONE]":
				done = true
			case strings.Contains(p, `"content":"tok`):
				i := strings.Index(p, `"content":"`) + len(`"content":"`)
				toks = append(toks, p[i:i+strings.IndexByte(p[i:], ' ')])
			default:
				toks = append(toks, "other: "+p)
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return toks, done, err
		}
	}
}

func wantTokens(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("tok")
		b.WriteString(strconv.Itoa(i))
	}
	return b.String()
}

// streamResult is how a client's stream went: its token events in
// order, whether [DONE] ended it, and what ended the reading otherwise.
type streamResult struct {
	who  string
	toks []string
	done bool
	err  error
}

// postStream posts a chat stream to the router at url and reads it all.
func postStream(url string) streamResult {
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatStream))
	if err != nil {
		return streamResult{err: err}
	}
	defer resp.Body.Close()
	toks, done, err := readStream(resp.Body)
	return streamResult{toks: toks, done: done, err: err}
}

// awaitStream fails t unless the next stream of results (within 20 s) is
// whole: events token events in order, then [DONE].
func awaitStream(t *testing.T, results <-chan streamResult, events int) {
	t.Helper()
	var r streamResult
	select {
	case r = <-results:
	case <-time.After(20 * time.Second):
		t.Fatal("a stream did not end within 20 s")
	}
	if r.err != nil || !r.done || strings.Join(r.toks, ",") != wantTokens(events) {
		t.Fatalf("%s stream: err %v, done %v, %d tokens %v; want %d in order and [DONE]", r.who, r.err, r.done, len(r.toks), r.toks, events)
	}
}

// relayTicked relays streams streams of events token events each from a
// ticked engine through a router configured by edit, and fails t unless
// every one came whole; the router, for what it counted.
func relayTicked(t *testing.T, streams, events int, edit func(*Config)) *testRouter {
	t.Helper()
	up := newTickedUpstream(t, events, 0)
	tr := startRouter(t, []string{up.url}, withConfig(edit))
	stop := make(chan struct{})
	defer close(stop)
	go up.run(3*time.Millisecond, stop)
	results := make(chan streamResult, streams)
	for range streams {
		go func() { results <- postStream(tr.url) }()
	}
	for range streams {
		awaitStream(t, results, events)
	}
	return tr
}

// Streams whose engines send together are read and written in batches,
// and every client still gets its own events, whole, in order, and
// [DONE]; the router counts each stream's end as clean.
func TestStreamBatchRelaysStreamsReadyTogether(t *testing.T) {
	skipWithoutRing(t)
	const streams = 12
	tr := relayTicked(t, streams, 40, func(c *Config) { c.RequestLoops = 1 })
	if n := batchedOps(tr); n == 0 {
		t.Fatal("no read or write was batched")
	}
	waitFor(t, "every stream's end counted", func() bool { return exitsOf(tr, "end") == streams })
	if bad := exitsOf(tr, "slow_client") + exitsOf(tr, "client_gone") + exitsOf(tr, "upstream_error"); bad != 0 {
		t.Fatalf("%v streams left the loop for another reason than their end", bad)
	}
}

// In a batch, a client whose socket is full has its stream handed to a
// goroutine with the bytes its socket did not take, and gets every event
// once it reads again; a client that leaves ends its own stream only.
func TestStreamBatchSlowAndGoneClients(t *testing.T) {
	skipWithoutRing(t)
	const streams, events = 5, 100
	up := newTickedUpstream(t, events, 64000) // 6.4 MB a stream: more than a socket buffers (net.ipv4.tcp_wmem's 4 MiB)
	tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) { c.RequestLoops = 1 }))
	stop := make(chan struct{})
	defer close(stop)
	go up.run(3*time.Millisecond, stop)
	body := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(chatStream)) + "\r\n\r\n" + chatStream)
	dial := func(rcvbuf int) net.Conn {
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf) }) //nolint:errcheck
		}}
		c, err := d.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(body); err != nil {
			t.Fatal(err)
		}
		return c
	}
	results := make(chan streamResult, streams)
	read := func(who string, c net.Conn, after <-chan struct{}) {
		<-after
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			results <- streamResult{who: who, err: err}
			return
		}
		toks, done, err := readStream(resp.Body)
		results <- streamResult{who, toks, done, err}
	}
	now, steadyDone := make(chan struct{}), make(chan struct{})
	close(now)
	slow := dial(4096)
	gone := dial(1 << 16)
	// The slow client reads once the others are done: its stream's 6.4 MB
	// wait in sockets that take less.
	go read("slow", slow, steadyDone)
	go func() {
		time.Sleep(50 * time.Millisecond)
		gone.Close()
	}()
	for range streams - 2 {
		go read("steady", dial(1<<16), now)
	}
	for range streams - 2 {
		awaitStream(t, results, events)
	}
	close(steadyDone)
	awaitStream(t, results, events)
	if n := batchedOps(tr); n == 0 {
		t.Fatal("no read or write was batched")
	}
	if n := exitsOf(tr, "slow_client"); n < 1 {
		t.Fatalf("%v streams handed back for a full client socket, want at least the slow one's", n)
	}
}

// A ring that failed stops the loop's batch for good, says why once,
// and is kept with the buffers the kernel may still hold.
func TestRingFailureStopsTheBatch(t *testing.T) {
	u, err := netloop.OpenRing()
	if err != nil {
		t.Skipf("io_uring refused by this kernel: %v", err)
	}
	t.Cleanup(u.Close)
	failed := errors.New("io_uring_enter waiting for completions: an errno not documented")
	var said []error
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	p := newStreamPump(Config{}.withDefaults(), m, nil, func(err error) { said = append(said, err) })
	p.batch.ring = u
	p.ringFailed(failed)
	p.ringFailed(failed)
	if p.batch.ring != nil || p.batch.spent != u || len(said) != 1 || said[0] != failed {
		t.Fatalf("after the failure: ring %v, spent %v, said %v", p.batch.ring, p.batch.spent, said)
	}
}

// upstream.unbatched_io: every read and write a system call.
func TestUnbatchedIOMakesNoBatch(t *testing.T) {
	tr := relayTicked(t, 6, 20, func(c *Config) { c.RequestLoops, c.UnbatchedIO = 1, true })
	if n := batchedOps(tr); n != 0 {
		t.Fatalf("%d reads and writes batched, want none", n)
	}
}

// A kernel that refuses io_uring is said once for the server, not once a
// loop: every loop would say the same.
func TestBatchOffIsLoggedOnce(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	s := &Server{log: zap.New(core)}
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	p := newStreamPump(Config{}.withDefaults(), m, nil, s.batchOff)
	q := newStreamPump(Config{}.withDefaults(), m, nil, s.batchOff)
	p.batchOff(unix.EPERM)
	q.batchOff(unix.ENOSYS)
	if n := logs.Len(); n != 1 {
		t.Fatalf("%d log lines, want 1", n)
	}
	if e := logs.All()[0]; !strings.Contains(e.Message, "io_uring") || e.ContextMap()["error"] != unix.EPERM.Error() {
		t.Fatalf("logged %q %v, want the refusal and its error", e.Message, e.ContextMap())
	}
}

// A stream's last bytes and its client's hang-up in one wake-up: the read
// (batched) ends the stream cleanly, and the hang-up after it finds
// nothing to end, as when each was acted on in the wait's order. Acted on
// the stream as looked up before the batch, it would be let go twice.
func TestStreamBatchComesBeforeTheEventsAfterIt(t *testing.T) {
	skipWithoutRing(t)
	craw, _, _ := looptest.RawPair(t)
	up, engine := looptest.SocketPair(t)
	if _, err := netloop.Write(engine, []byte(chunk(tokenEvent(1)+"data: [DONE]\n\n")+"0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: Config{}.withDefaults(), now: time.Now}
	p := newStreamPump(s.cfg, m, nil, nil)
	p.streams, p.buf = netloop.FDTable[detachedBody]{}, make([]byte, 64<<10)
	p.openBatch()
	t.Cleanup(p.closeBatch)
	p.at = time.Now()
	r := &relay{x: &exchange{s: s, ep: openai.Chat, received: time.Now()}, gotBody: true}
	d := &detachedBody{pump: p, r: r, client: craw, fd: up, pfd: up, cfd: -1, to: &timeouts{idle: time.Minute}, back: make(chan pumpResult, 1), in: true, inPump: true}
	d.write = d.writeFrame
	r.body = d
	p.streams.Set(up, d)
	p.size.Add(1)

	dispatched := make(chan struct{})
	go func() {
		p.dispatch([]unix.EpollEvent{
			{Events: unix.EPOLLIN, Fd: int32(up)},
			{Events: unix.EPOLLRDHUP, Fd: int32(up), Pad: clientTag},
		}, time.Now())
		close(dispatched)
	}()
	select {
	case <-dispatched:
	case <-time.After(5 * time.Second):
		t.Fatal("the wake-up's events were not acted on within 5 s: the stream was handed back twice")
	}
	if res := <-d.back; res.readErr != io.EOF {
		t.Fatalf("handed back with %v, want its clean end (EOF)", res.readErr)
	}
	if end, aborted, size := testutil.ToFloat64(m.loopOut.WithLabelValues("end")), testutil.ToFloat64(m.loopOut.WithLabelValues("aborted")), p.size.Load(); end != 1 || aborted != 0 || size != 0 {
		t.Fatalf("exits end %v aborted %v, %d streams left; want 1, 0, 0", end, aborted, size)
	}
}
