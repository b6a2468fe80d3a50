package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// lockedBuffer is a bytes.Buffer safe to read while the logBuffer writes.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes++
	return l.b.Write(p)
}

func (l *lockedBuffer) state() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String(), l.writes
}

func TestLogBufferBatchesAndFlushes(t *testing.T) {
	var out lockedBuffer
	b := newLogBuffer(&out, 64, time.Hour)
	for range 5 {
		b.Write([]byte("0123456789\n")) //nolint:errcheck
	}
	if s, n := out.state(); n != 0 || s != "" {
		t.Fatalf("wrote before the buffer filled: %d writes, %q", n, s)
	}
	b.Write([]byte("0123456789\n")) //nolint:errcheck // 66 bytes: the first five go out in one write
	if s, n := out.state(); n != 1 || len(s) != 55 {
		t.Fatalf("%d writes, %d bytes; want 1 write of 55", n, len(s))
	}
	big := bytes.Repeat([]byte("x"), 100)
	b.Write(big) //nolint:errcheck // over the limit: the buffered line, then it, straight through
	if s, n := out.state(); n != 3 || !strings.HasSuffix(s, string(big)) {
		t.Fatalf("%d writes; want 3", n)
	}
	b.Write([]byte("last\n")) //nolint:errcheck
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	if s, _ := out.state(); !strings.HasSuffix(s, "last\n") {
		t.Fatalf("Sync left a line behind: %q", s)
	}
}

func TestLogBufferRunFlushesOnTimerAndAtEnd(t *testing.T) {
	var out lockedBuffer
	b := newLogBuffer(&out, 1<<10, 5*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }() //nolint:errcheck
	b.Write([]byte("tick\n"))               //nolint:errcheck
	deadline := time.Now().Add(5 * time.Second)
	for s, _ := out.state(); s != "tick\n"; s, _ = out.state() {
		if time.Now().After(deadline) {
			t.Fatal("the timer never flushed")
		}
		time.Sleep(time.Millisecond)
	}
	b.Write([]byte("end\n")) //nolint:errcheck
	cancel()
	<-done
	if s, _ := out.state(); s != "tick\nend\n" {
		t.Fatalf("after Run ended: %q", s)
	}
}

// TestServeLosesNoAccessLogLineOnSIGTERM runs serve as a process, sends
// requests and stops it with SIGTERM at once, before the buffer's timer
// could write them: every request must still have its access log line.
func TestServeLosesNoAccessLogLineOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a router subprocess")
	}
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}`)
	}}
	go up.Serve(upLn)   //nolint:errcheck
	defer up.Shutdown() //nolint:errcheck

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logPath := filepath.Join(t.TempDir(), "router.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	// With a CPU profile too: written whole by the same shutdown.
	profile := filepath.Join(t.TempDir(), "cpu.pprof")
	cmd := exec.Command(os.Args[0], "serve", "--listen", addr, "--pool", "m=http://"+upLn.Addr().String(), "--cpu-profile", profile)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr, cmd.Stdout = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			cmd.Process.Kill() //nolint:errcheck
			<-exited
		}
	}()

	c := &fasthttp.Client{}
	const n = 50
	sent := 0
	deadline := time.Now().Add(20 * time.Second)
	for sent < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d requests answered", sent, n)
		}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://" + addr + "/v1/chat/completions")
		req.Header.SetMethod("POST")
		req.SetBodyString(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		err := c.DoTimeout(req, resp, 5*time.Second)
		ok := err == nil && resp.StatusCode() == 200
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		if ok {
			sent++
		} else {
			time.Sleep(10 * time.Millisecond) // still starting
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("serve exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
	readProfile(t, profile)
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := bytes.Count(log, []byte(`"msg":"request"`)); got != n {
		t.Fatalf("%d access log lines for %d requests answered:\n%s", got, n, log)
	}
	// Written by the proxy itself (logConfig.accessLog), each is still one
	// JSON object saying what zap's would.
	for _, line := range bytes.Split(log, []byte("\n")) {
		if !bytes.Contains(line, []byte(`"msg":"request"`)) {
			continue
		}
		var l struct {
			Level, TS, Msg, Model, Replica, Outcome string
			Status                                  int
			CompletionTokens                        int `json:"completion_tokens"`
		}
		if err := json.Unmarshal(line, &l); err != nil {
			t.Fatalf("access log line is not JSON (%v): %s", err, line)
		}
		if l.Level != "info" || l.Model != "m" || l.Replica != upLn.Addr().String() || l.Status != 200 || l.Outcome != "ok" || l.CompletionTokens != 1 || l.TS == "" {
			t.Fatalf("access log line %s", line)
		}
	}
}

func TestAccessLogOnlyForJSONAtInfo(t *testing.T) {
	w := &bytes.Buffer{}
	for _, tt := range []struct {
		lc   logConfig
		want bool
	}{
		{logConfig{}, true},
		{logConfig{Level: "info", Format: "json"}, true},
		{logConfig{Level: "debug"}, true},
		{logConfig{Level: "warn"}, false},
		{logConfig{Format: "console"}, false},
	} {
		if got := tt.lc.accessLog(w) != nil; got != tt.want {
			t.Errorf("%+v: access log straight from the proxy %v, want %v", tt.lc, got, tt.want)
		}
	}
}
