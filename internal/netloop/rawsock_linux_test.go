//go:build linux

package netloop

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/internal/netloop/looptest"

	"golang.org/x/sys/unix"
)

// rawConnOf is a net.Conn whose Read and Write are rawSock's.
type rawConnOf struct {
	net.Conn
	s RawSock
}

func (c *rawConnOf) Read(p []byte) (int, error)  { return c.s.Read(p) }
func (c *rawConnOf) Write(p []byte) (int, error) { return c.s.Write(p) }

// sockImpl is one way to do a connection's I/O: wrap returns the
// connection to read and write through.
type sockImpl struct {
	name string
	wrap func(testing.TB, net.Conn) net.Conn
}

// sockImpls are net.Conn's own I/O and rawSock's.
func sockImpls() []sockImpl {
	return []sockImpl{
		{"net.Conn", func(_ testing.TB, c net.Conn) net.Conn { return c }},
		{"rawSock", func(t testing.TB, c net.Conn) net.Conn {
			rc := &rawConnOf{Conn: c}
			if !rc.s.take(c) {
				t.Fatal("rawSock did not take a TCP connection")
			}
			return rc
		}},
		{"FileConn", func(t testing.TB, c net.Conn) net.Conn { return asFileConn(t, c) }},
		{"FileConn+rawSock", func(t testing.TB, c net.Conn) net.Conn {
			fc := asFileConn(t, c)
			rc := &rawConnOf{Conn: fc}
			if !rc.s.take(fc) {
				t.Fatal("rawSock did not take a FileConn")
			}
			return rc
		}},
	}
}

// asFileConn moves c's socket into a FileConn, as the stream loop gives
// an upstream connection back (detachedBody): a duplicate descriptor, c
// closed.
func asFileConn(t testing.TB, c net.Conn) *FileConn {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	var dupErr error
	if err := rc.Control(func(s uintptr) { fd, dupErr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || dupErr != nil {
		t.Fatal(err, dupErr)
	}
	fc := NewFileConn(fd, c.LocalAddr(), c.RemoteAddr())
	c.Close()
	t.Cleanup(func() { fc.Close() })
	return fc
}

// TestRawSockActsAsNetConn runs the same exchanges on a plain net.Conn and
// on rawSock: the bytes, the waits (a write larger than the socket takes,
// a read before the bytes come), io.EOF, deadlines, Close and a reset must
// read the same to fasthttp and to peerClosedErr.
func TestRawSockActsAsNetConn(t *testing.T) {
	for _, im := range sockImpls() {
		t.Run(im.name, func(t *testing.T) {
			t.Run("bytes both ways, waits, EOF", func(t *testing.T) {
				c, p := looptest.TCPPair(t, im.wrap)
				big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: more than the socket takes at once
				got := make(chan []byte, 1)
				go func() {
					b, _ := io.ReadAll(io.LimitReader(p, int64(len(big))))
					got <- b
				}()
				if n, err := c.Write(big); n != len(big) || err != nil {
					t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(big))
				}
				select {
				case b := <-got:
					if !bytes.Equal(b, big) {
						t.Fatalf("peer read %d bytes, not what was written", len(b))
					}
				case <-time.After(10 * time.Second):
					t.Fatal("peer never read the whole write")
				}
				go func() {
					time.Sleep(20 * time.Millisecond) // the read waits first
					p.Write([]byte("hello"))
					p.CloseWrite()
				}()
				buf := make([]byte, 64)
				n, err := io.ReadFull(c, buf[:5])
				if err != nil || string(buf[:n]) != "hello" {
					t.Fatalf("Read = %q, %v", buf[:n], err)
				}
				if n, err := c.Read(buf); n != 0 || err != io.EOF {
					t.Fatalf("Read after the peer's end = %d, %v; want 0, io.EOF", n, err)
				}
				if n, err := c.Read(nil); n != 0 || err != nil {
					t.Fatalf("Read(nil) = %d, %v; want 0, nil", n, err)
				}
			})
			t.Run("deadline", func(t *testing.T) {
				c, _ := looptest.TCPPair(t, im.wrap)
				c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
				_, err := c.Read(make([]byte, 8))
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("Read past the deadline = %v; want a timeout", err)
				}
				var oe *net.OpError
				if !errors.As(err, &oe) || oe.Op != "read" || oe.Net != "tcp" {
					t.Fatalf("error %#v; want an OpError for read on tcp", err)
				}
			})
			t.Run("closed while reading", func(t *testing.T) {
				c, _ := looptest.TCPPair(t, im.wrap)
				var wg sync.WaitGroup
				var err error
				wg.Go(func() { _, err = c.Read(make([]byte, 8)) })
				time.Sleep(20 * time.Millisecond)
				c.Close()
				wg.Wait()
				if !errors.Is(err, net.ErrClosed) {
					t.Fatalf("Read on a closed connection = %v; want net.ErrClosed", err)
				}
			})
			t.Run("reset", func(t *testing.T) {
				c, p := looptest.TCPPair(t, im.wrap)
				p.SetLinger(0)
				p.Close() // a reset, as an engine killed mid-connection sends
				time.Sleep(20 * time.Millisecond)
				var err error
				for i := 0; i < 50 && err == nil; i++ { // the first write may land before the reset is seen
					_, err = c.Write([]byte("x"))
					time.Sleep(time.Millisecond)
				}
				if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
					t.Fatalf("Write after a reset = %v; want ECONNRESET or EPIPE", err)
				}
				var oe *net.OpError
				if !errors.As(err, &oe) || oe.Op != "write" {
					t.Fatalf("error %#v; want an OpError for write", err)
				}
			})
		})
	}
}

// TestRawSockLeavesOtherConns: a connection that is not a TCP socket keeps
// net.Conn's own I/O.
func TestRawSockLeavesOtherConns(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var s RawSock
	if s.take(a) || s.OK() {
		t.Fatal("rawSock took a net.Pipe")
	}
}

// BenchmarkRawSockWrite is one small write and its read on a loopback
// socket, through rawSock, against net.Conn's (b.ReportAllocs: none
// per call).
func BenchmarkRawSockWrite(b *testing.B) {
	for _, im := range sockImpls() {
		b.Run(im.name, func(b *testing.B) {
			w, p := looptest.TCPPair(b, im.wrap)
			msg := make([]byte, 512)
			buf := make([]byte, 512)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := w.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(p, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
