package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/tokens"
)

// The estimator loads a BPE vocabulary: build it once for all tests.
var (
	estOnce sync.Once
	estVal  *tokens.Estimator
)

func testEstimator(t testing.TB) *tokens.Estimator {
	estOnce.Do(func() {
		var err error
		if estVal, err = tokens.New(); err != nil {
			panic(err)
		}
	})
	return estVal
}

func mustBuiltin(t testing.TB, name string) Profile {
	t.Helper()
	p, err := Builtin(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startFleet runs a fleet on ephemeral ports and stops it (checking that it
// does stop) when the test ends.
func startFleet(t testing.TB, cfg FleetConfig) *Fleet {
	t.Helper()
	if cfg.Estimator == nil {
		cfg.Estimator = testEstimator(t)
	}
	f, err := NewFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("fleet Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("fleet did not stop:\n%s", buf[:runtime.Stack(buf, true)])
		}
	})
	return f
}

// fastProfile is qwen2.5-7b on a tenfold faster GPU: 1 ms decode steps, so
// HTTP tests finish quickly.
func fastFleet(t testing.TB, n int) *Fleet {
	p := mustBuiltin(t, "qwen2.5-7b")
	return startFleet(t, FleetConfig{Replicas: n, Profiles: []Profile{p}, Speeds: []float64{10},
		ServedModelNames: []string{"qwen", "qwen-alias"}})
}

// httpDo sends one request with a fresh connection and returns status,
// headers and body.
func httpDo(t testing.TB, method, url, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	req.Close = true
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// rawStream is a hand-rolled HTTP/1.1 client for one streaming request: the
// test controls the TCP connection (to close it at a chosen moment) and
// reads SSE events one by one.
type rawStream struct {
	conn   net.Conn
	br     *bufio.Reader
	status int
	header http.Header
	body   io.Reader
	sc     *bufio.Scanner
}

func openStream(t testing.TB, baseURL, path, body string, hdr ...string) *rawStream {
	t.Helper()
	addr := strings.TrimPrefix(baseURL, "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, addr, len(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&sb, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	sb.WriteString("\r\n")
	sb.WriteString(body)
	if _, err := io.WriteString(c, sb.String()); err != nil {
		t.Fatal(err)
	}
	return &rawStream{conn: c, br: bufio.NewReader(c)}
}

// readHeader reads the status line and headers.
func (s *rawStream) readHeader(t testing.TB) {
	t.Helper()
	_ = s.conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(s.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.status, s.header, s.body = resp.StatusCode, resp.Header, resp.Body
	s.sc = bufio.NewScanner(resp.Body)
	s.sc.Buffer(make([]byte, 1<<20), 1<<20)
}

// next returns the next SSE data payload ("" at end of body).
func (s *rawStream) next(t testing.TB) string {
	t.Helper()
	for s.sc.Scan() {
		line := s.sc.Text()
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			return data
		}
	}
	return ""
}

func (s *rawStream) close() { _ = s.conn.Close() }

// chunk is the union of the chat and completion chunk fields tests read.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

func parseChunk(t testing.TB, data string) chunk {
	t.Helper()
	var c chunk
	if err := json.Unmarshal([]byte(data), &c); err != nil {
		t.Fatalf("bad chunk %q: %v", data, err)
	}
	return c
}

// waitFor polls cond until it holds or the deadline passes. It is for
// observing another process-like component (a server across a socket), not
// for ordering the test's own goroutines.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
