package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
)

// BenchmarkLimitReadTimeoutCut times the read_timeout claim that
// TestLimitReadTimeoutCutsSlowClients leaves out: a client sending its
// request a byte every 10ms is cut soon after read_timeout. cut-ms is from
// dialing to the 408; late-ms is how far past read_timeout that was (a few
// ms of scheduling on an idle machine; negative would mean the router cut
// early). The request never reaches a replica, so the pool's one replica
// is an address nothing answers on.
func BenchmarkLimitReadTimeoutCut(b *testing.B) {
	const readTimeout = 100 * time.Millisecond
	cfg := fileConfig{Log: logConfig{Level: "error"}, Limits: limitsConfig{ReadTimeout: readTimeout},
		Pools: []poolConfig{{Model: "m", Policy: "round_robin",
			Replicas: []replicaConfig{{Name: "r0", URL: "http://127.0.0.1:9"}}}}}
	applyDefaults(&cfg)
	if err := validate(cfg); err != nil {
		b.Fatal(err)
	}
	r, err := newRouter(cfg, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.run(ctx, ln, time.Second); close(done) }() //nolint:errcheck
	b.Cleanup(func() { cancel(); <-done })

	slow := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
		fmt.Sprintf("Content-Length: %d\r\n\r\n", len(chatBody)) + chatBody
	var total time.Duration
	b.ReportAllocs()
	for b.Loop() {
		// Taken before dialing: the router's deadline starts at its
		// accept, which can come before Dial returns here.
		start := time.Now()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		sent := sendSlowly(c, "", slow, 10*time.Millisecond)
		c.SetReadDeadline(time.Now().Add(10 * readTimeout))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			b.Fatalf("no response: %v", err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		total += time.Since(start)
		if resp.StatusCode != http.StatusRequestTimeout {
			b.Fatalf("status %d, want 408", resp.StatusCode)
		}
		c.Close()
		if n := <-sent; n >= len(slow) {
			b.Fatalf("the slow client sent all %d bytes before being cut", n)
		}
	}
	cut := float64(total) / float64(b.N) / float64(time.Millisecond)
	b.ReportMetric(cut, "cut-ms")
	b.ReportMetric(cut-float64(readTimeout/time.Millisecond), "late-ms")
}
