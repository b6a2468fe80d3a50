package proxy

import (
	"bytes"
	"io"
	"net"
	"syscall"
	"testing"
)

// countingConn counts the reads that reach the socket.
type countingConn struct {
	net.Conn
	reads int
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads++
	return c.Conn.Read(p)
}

func TestPrefetchConnReadsAheadOnce(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	req := bytes.Repeat([]byte("r"), 700)
	go func() { b.Write(req); b.Close() }() //nolint:errcheck
	cc := &countingConn{Conn: a}
	c := &prefetchConn{Conn: cc}
	one := make([]byte, 1)
	if n, err := c.Read(one); n != 1 || err != nil {
		t.Fatalf("first byte: %d, %v", n, err)
	}
	rest := make([]byte, 4096)
	n, err := c.Read(rest)
	if err != nil || n != len(req)-1 {
		t.Fatalf("rest: %d, %v; want %d", n, err, len(req)-1)
	}
	if cc.reads != 1 {
		t.Fatalf("%d socket reads for one request, want 1", cc.reads)
	}
	if c.buf != nil {
		t.Fatal("a drained connection still holds its read-ahead buffer")
	}
	if _, err := c.Read(rest); err != io.EOF {
		t.Fatalf("after the end: %v, want EOF", err)
	}
}

func TestPrefetchConnLargeReadGoesStraight(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { b.Write([]byte("hello")) }() //nolint:errcheck
	c := &prefetchConn{Conn: a}
	p := make([]byte, prefetchSize)
	if n, err := c.Read(p); n != 5 || err != nil || c.buf != nil {
		t.Fatalf("%d, %v, buffer held: %v", n, err, c.buf != nil)
	}
}

func TestPrefetchConnExposesSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			c.Close()
		}
	}()
	c, err := prefetchListener{Listener: ln}.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.(syscall.Conn).SyscallConn(); err != nil {
		t.Fatalf("a TCP connection's socket is hidden: %v", err)
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if _, err := (&prefetchConn{Conn: p1}).SyscallConn(); err == nil {
		t.Fatal("an in-memory connection claims a socket")
	}
}

// BenchmarkPrefetchConnRead is a one-byte read and the rest, as fasthttp
// reads each keep-alive request (over an in-memory conn: the wrapper's own
// cost, 0 allocs).
func BenchmarkPrefetchConnRead(b *testing.B) {
	src := &repeatConn{chunk: bytes.Repeat([]byte("r"), 500)}
	c := &prefetchConn{Conn: src}
	one, rest := make([]byte, 1), make([]byte, 4096)
	b.ReportAllocs()
	for b.Loop() {
		c.Read(one)  //nolint:errcheck
		c.Read(rest) //nolint:errcheck
	}
}

// repeatConn is a net.Conn whose every read returns the same chunk.
type repeatConn struct {
	net.Conn
	chunk []byte
}

func (l *repeatConn) Read(p []byte) (int, error) { return copy(p, l.chunk), nil }

// A client connection that is not a TCP socket keeps net.Conn's own I/O
// (netloop.RawSock leaves it).
func TestPrefetchConnOverAPipe(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	pc := newPrefetchConn(a, nil, nil)
	go b.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(pc, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("prefetchConn over a pipe read %q, %v", buf, err)
	}
}
