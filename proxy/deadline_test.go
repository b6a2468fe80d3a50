package proxy

import (
	"bytes"
	"net"
	"testing"
	"time"
)

// deadlineRecorder records the read deadlines set on it.
type deadlineRecorder struct {
	repeatConn
	set []time.Time
}

func (d *deadlineRecorder) SetReadDeadline(t time.Time) error {
	d.set = append(d.set, t)
	return nil
}

// TestDeadlineConnArmsOncePerSlack: reads in quick succession leave the
// armed deadline alone while it stays within [now+d, now+d+slack], and
// the deadline always lies in that window after a read starts.
func TestDeadlineConnArmsOncePerSlack(t *testing.T) {
	rec := &deadlineRecorder{repeatConn: repeatConn{chunk: []byte("x")}}
	c := &deadlineConn{Conn: rec, to: &timeouts{firstByte: time.Hour, idle: time.Minute}}
	p := make([]byte, 16)
	for range 100 {
		before := time.Now()
		if _, err := c.Read(p); err != nil {
			t.Fatal(err)
		}
		lo, hi := before.Add(time.Minute), time.Now().Add(time.Minute+time.Second)
		if c.armed.Before(lo) || c.armed.After(hi) {
			t.Fatalf("deadline %s outside [%s, %s]", c.armed, lo, hi)
		}
	}
	if len(rec.set) != 1 {
		t.Fatalf("%d deadlines set for 100 quick reads, want 1", len(rec.set))
	}
	// A request starts: the first-byte limit applies, an hour, and the
	// minute-away deadline is re-armed.
	c.awaiting = true
	c.Read(p) //nolint:errcheck
	if len(rec.set) != 2 || rec.set[1].Sub(time.Now()) < 59*time.Minute {
		t.Fatalf("first-byte deadline not armed: %v", rec.set)
	}
	// Back to the idle limit: a deadline an hour away would fire late.
	c.awaiting = false
	c.Read(p) //nolint:errcheck
	if len(rec.set) != 3 || rec.set[2].Sub(time.Now()) > 2*time.Minute {
		t.Fatalf("idle deadline not re-armed: %v", rec.set)
	}
	c.to.idle = 0
	c.Read(p) //nolint:errcheck
	if len(rec.set) != 4 || !rec.set[3].IsZero() {
		t.Fatalf("no limit: deadline not cleared: %v", rec.set)
	}
}

// BenchmarkDeadlineConnRead is the per-event read of a stream's upstream
// connection, deadline bookkeeping included (0 allocs).
func BenchmarkDeadlineConnRead(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if s, err := ln.Accept(); err == nil {
			defer s.Close()
			buf := make([]byte, 4096)
			for {
				if _, err := s.Read(buf); err != nil {
					return
				}
			}
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	// Reads come from an in-memory chunk; the deadline is set on the real
	// socket, as on the router's upstream connections.
	c := &deadlineConn{Conn: &realDeadline{repeatConn: repeatConn{chunk: bytes.Repeat([]byte("e"), 200)}, sock: conn}, to: &timeouts{idle: time.Minute}}
	p := make([]byte, 2048)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Read(p); err != nil {
			b.Fatal(err)
		}
	}
}

type realDeadline struct {
	repeatConn
	sock net.Conn
}

func (r *realDeadline) SetReadDeadline(t time.Time) error { return r.sock.SetReadDeadline(t) }
