package main

// Fault matrix row: an upstream that answers garbage. The simulator always
// speaks correct HTTP and JSON, so a small raw-TCP stand-in plays the
// broken engine: it answers /health (so it stays in the pool) and sends
// fixed bytes for every inference request.

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// startGarbageUpstream serves /health with 200 and answers any other
// request with raw, then closes the connection.
func startGarbageUpstream(t *testing.T, raw string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{} // nil once closed
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer wg.Wait()
		defer mu.Unlock()
		for c := range conns {
			c.Close() // idle keep-alive connections of the health prober
		}
		conns = nil
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if conns == nil {
				c.Close()
			} else {
				conns[c] = true
			}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body) //nolint:errcheck
					if req.URL.Path == "/health" {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") //nolint:errcheck
						continue
					}
					io.WriteString(c, raw) //nolint:errcheck
					return
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// Garbage or a truncated answer before anything reached the client is a
// 502 with an OpenAI error; once a stream has started it can only end with
// an error event and [DONE]. The router records each as the engine's
// failure.
func TestFaultUpstreamGarbage(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
	tests := []struct {
		name    string
		raw     string
		stream  bool
		status  int
		code    string // error code in the body or the stream's error event
		outcome string // what the router recorded
		events  int    // stream data events the client got, the error event included
	}{
		{"truncated JSON body", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 24\r\n\r\n" + `{"id":"x","choices":[{"`,
			false, 502, "bad_upstream", "upstream_error", 0},
		{"body shorter than Content-Length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n" + `{"id":"x"}`,
			false, 502, "bad_upstream", "upstream_error", 0},
		{"200 that is not JSON", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n<html>oops<",
			false, 502, "bad_upstream", "upstream_error", 0},
		{"not HTTP at all", "\x00\x01\x02 garbage garbage\r\n\r\n", false, 502, "bad_upstream", "upstream_error", 0},
		{"stream cut mid-event", sse + "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choi",
			true, 200, "bad_upstream", "broken_stream", 2},
		{"stream of garbage lines", sse + "\x00\x01 not sse\n\nmore garbage\n\n", true, 200, "bad_upstream", "broken_stream", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := faultConfig([]string{startGarbageUpstream(t, tt.raw)}, "round_robin")
			cfg.Telemetry.Disabled = true // the stand-in has no /metrics
			tr := startTestRouter(t, cfg, nil)
			v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(tt.stream, 8), nil)
			code := v.errCode
			if !tt.stream {
				code, _ = errorCode(v.body)
			}
			if v.status != tt.status || code != tt.code || (tt.stream && !v.done) || v.err != nil {
				t.Fatalf("client saw %+v (code %q), want %d with %s", v, code, tt.status, tt.code)
			}
			if v.events != tt.events {
				t.Fatalf("client got %d stream events, want %d", v.events, tt.events)
			}
			if n := tr.requests("outcome", tt.outcome); n != 1 {
				t.Fatalf("router recorded %d %s requests, want 1", n, tt.outcome)
			}
			tr.waitIdle(5 * time.Second)
		})
	}
}
