//go:build linux

package proxycost

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startLoop runs ServeLoop in front of a fresh upstream sending events
// every interval; it is stopped (and must return) at the test's end.
func startLoop(t *testing.T, events int, interval time.Duration) (addr string) {
	t.Helper()
	up := newUpstream(interval, events, chatReply(500), time.Now)
	if err := up.listen(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.stop)
	addr, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeLoop(ctx, addr, up.addr()) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("ServeLoop: %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Error("ServeLoop did not return after its context ended")
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("ServeLoop never listened on %s: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

func TestLoopRelaysRepliesAndStreamsOnKeptAliveConnections(t *testing.T) {
	addr := startLoop(t, 20, time.Millisecond)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 10 * time.Second}
	for i := range 3 { // whole replies, then a stream, on the one connection
		resp, err := hc.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Equal(b, chatReply(500)) {
			t.Fatalf("reply %d: status %d, %d bytes, want the upstream's %d", i, resp.StatusCode, len(b), len(chatReply(500)))
		}
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set(modeHeader, modeSSE)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var events int
	var last string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if _, ok := eventStamp(sc.Bytes()); ok {
			events++
		}
		if sc.Text() != "" {
			last = sc.Text()
		}
	}
	if err := sc.Err(); err != nil || events != 20 || last != "data: [DONE]" {
		t.Fatalf("stream: %d events, last line %q, err %v; want 20 and [DONE]", events, last, err)
	}
}

// TestLoopWaitsForARequestSentInPieces: a head and body split over writes
// (and a second request pipelined behind the first) are relayed whole.
func TestLoopWaitsForARequestSentInPieces(t *testing.T) {
	addr := startLoop(t, 1, time.Millisecond)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
	for _, part := range []string{req[:10], req[10 : len(req)-5], req[len(req)-5:] + req} {
		if _, err := io.WriteString(c, part); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	br := bufio.NewReader(c)
	for i := range 2 {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if !bytes.Equal(b, chatReply(500)) {
			t.Fatalf("response %d: %d bytes, want %d", i, len(b), len(chatReply(500)))
		}
	}
}
