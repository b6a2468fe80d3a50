package proxy

import (
	"net"
	"testing"
	"time"
)

func TestIdleConnsTakesTheNewestAndClosesStaleOnes(t *testing.T) {
	l := idleConns{maxIdle: 4 * time.Second}
	t0 := time.Unix(1000, 0)
	a, a2 := net.Pipe()
	b, b2 := net.Pipe()
	defer a2.Close()
	defer b2.Close()
	l.put(a, t0)
	l.put(b, t0.Add(3*time.Second))
	if c := l.take(t0.Add(4 * time.Second)); c != b {
		t.Fatalf("took %v, want the newest connection", c)
	}
	// a has been idle 5 s by now: closed, not handed out.
	if c := l.take(t0.Add(5 * time.Second)); c != nil {
		t.Fatalf("took %v, want none (the one left is stale)", c)
	}
	if err := a.SetDeadline(time.Now()); err == nil { // a closed pipe refuses it; an open one would block a write
		t.Fatal("the stale connection was not closed")
	}
	for i := 0; i < maxIdleConns+1; i++ {
		c, c2 := net.Pipe()
		defer c2.Close()
		l.put(c, t0)
	}
	if n := len(l.conns); n != maxIdleConns {
		t.Fatalf("%d connections kept, want at most %d", n, maxIdleConns)
	}
}

func TestIdleConnsClosesStaleOnesWhenOneIsKept(t *testing.T) {
	l := idleConns{maxIdle: 4 * time.Second}
	t0 := time.Unix(1000, 0)
	a, a2 := net.Pipe()
	b, b2 := net.Pipe()
	defer a2.Close()
	defer b2.Close()
	l.put(a, t0)
	l.put(b, t0.Add(5*time.Second))                   // a has been idle 5 s
	if err := a.SetDeadline(time.Now()); err == nil { // a closed pipe refuses it; an open one would block a write
		t.Fatal("the stale connection was kept open")
	}
	if n := len(l.conns); n != 1 || l.conns[0].c != b {
		t.Fatalf("%d connections kept, want only the new one", n)
	}
}
