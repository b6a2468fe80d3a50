//go:build linux

package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func quickAck(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	v, gerr := -1, error(nil)
	if err := raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	return v
}

func TestDelayAcksLeavesQuickAckMode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v := quickAck(t, c); v != 1 {
		t.Fatalf("a fresh connection reads TCP_QUICKACK %d, want 1 (not in pingpong mode)", v)
	}
	delayAcks(c)
	if v := quickAck(t, c); v != 0 {
		t.Fatalf("after delayAcks TCP_QUICKACK reads %d, want 0 (pingpong mode)", v)
	}
}

// ackEngine streams events one segment at a time, at an engine's pace,
// and counts the ACK segments the router sends back meanwhile (TCP_INFO
// on its side of the connection: segments in without data).
type ackEngine struct {
	url    string
	events int
	acks   chan uint32
}

type connKey struct{}

func newAckEngine(t *testing.T, events int) *ackEngine {
	t.Helper()
	e := &ackEngine{events: events, acks: make(chan uint32, 4)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.url = "http://" + ln.Addr().String()
	srv := &http.Server{
		Handler:     http.HandlerFunc(e.serve),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
	}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
	return e
}

func (e *ackEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	io.Copy(io.Discard, r.Body) //nolint:errcheck
	c := r.Context().Value(connKey{}).(net.Conn)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	fl := w.(http.Flusher)
	event := func(i int) {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i)
		fl.Flush()
	}
	event(0)
	time.Sleep(5 * time.Millisecond) // the head and the first event acknowledged, or not
	before, err := tcpInfo(c)
	for i := 1; i <= e.events && err == nil && r.Context().Err() == nil; i++ {
		time.Sleep(2 * time.Millisecond)
		event(i)
	}
	time.Sleep(10 * time.Millisecond)
	after, aerr := tcpInfo(c)
	fmt.Fprint(w, "data: [DONE]\n\n")
	if err == nil && aerr == nil {
		e.acks <- (after.Segs_in - before.Segs_in) - (after.Data_segs_in - before.Data_segs_in)
	}
}

func tcpInfo(c net.Conn) (*unix.TCPInfo, error) {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return nil, err
	}
	var info *unix.TCPInfo
	var ierr error
	if err := raw.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return nil, err
	}
	return info, ierr
}

// A stream on a fresh engine connection is acknowledged every second
// event, as on a reused one, on both request paths. Without delayAcks the
// kernel acknowledges each of its first 16 segments at once (its
// quick-ACK mode), however the router reads them: every one of the 12
// events counted here. With it, about every second one — unless the
// machine stalls a reader or the engine past the delayed-ACK timeout
// (40 ms), which ends the mode on any connection: a loaded machine gets
// a few tries, each on a fresh connection.
func TestFreshEngineConnectionAcksEverySecondEvent(t *testing.T) {
	for _, goroutines := range []bool{false, true} {
		t.Run(fmt.Sprintf("goroutine_requests=%v", goroutines), func(t *testing.T) {
			const events, tries = 12, 5
			var counts []uint32
			for range tries {
				// A router of its own each time: its engine connection is
				// a fresh one.
				e := newAckEngine(t, events)
				tr := startRouter(t, []string{e.url}, withConfig(func(c *Config) { c.GoroutineRequests = goroutines }))
				if st, done, b := call(t, tr.url, chatStream); st != 200 || !done {
					t.Fatalf("status %d complete=%v: %.300s", st, done, b)
				}
				select {
				case acks := <-e.acks:
					counts = append(counts, acks)
					if acks <= events*3/4 {
						t.Logf("%d ACK segments for %d events (tries: %v)", acks, events, counts)
						return
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the engine counted no ACKs")
				}
			}
			t.Fatalf("the router sent %v ACK segments for %d events on a fresh connection in %d tries: want about one every second event", counts, events, tries)
		})
	}
}
