package main

// The router's limits, end to end through a configured router: request
// size (headers 431, body 413), slow clients (read_timeout), concurrent
// connections (max_connections), a pool's max_tokens_limit, and the total
// deadline of a stream.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func limitsPool(t *testing.T) []poolConfig {
	return []poolConfig{simPoolConfig(startSimFleet(t, 1, nil).URLs(), 0)}
}

func TestLimitRequestSize(t *testing.T) {
	small := fileConfig{Log: logConfig{Level: "error"}, Pools: limitsPool(t),
		Limits: limitsConfig{MaxHeaderBytes: 4096, MaxBodyBytes: 4096}}
	def := fileConfig{Log: logConfig{Level: "error"}, Pools: small.Pools}
	smallURL, defURL := startTestRouter(t, small, nil).base, startTestRouter(t, def, nil).base
	bigBody := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("x", 8000) + `"}]}`
	tests := []struct {
		name   string
		base   string
		header int // bytes of an extra header
		body   string
		status int
		code   string
	}{
		{"header under the limit", smallURL, 2000, chatBody, 200, ""},
		{"header over the limit is 431", smallURL, 8000, chatBody, 431, "request_header_too_large"},
		{"default limit takes 8 KB headers", defURL, 8000, chatBody, 200, ""},
		{"default limit: 20 KB headers are 431", defURL, 20000, chatBody, 431, "request_header_too_large"},
		{"body over the limit is 413", smallURL, 0, bigBody, 413, "request_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, tt.base+"/v1/chat/completions", strings.NewReader(tt.body))
			if tt.header > 0 {
				req.Header.Set("X-Pad", strings.Repeat("p", tt.header))
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, b)
			}
			if tt.code != "" {
				if code, _ := errorCode(string(b)); code != tt.code {
					t.Fatalf("error code %q, want %q (an OpenAI error body): %s", code, tt.code, b)
				}
			}
		})
	}
}

// A client that sends its request a byte at a time is cut by read_timeout:
// it gets 408 naming that limit and its connection is closed while it is
// still sending. It never pauses for anywhere near read_timeout, so only a
// deadline on the whole request (not one per read) can cut it. How soon
// after read_timeout the cut comes is a timing claim:
// BenchmarkLimitReadTimeoutCut reports it.
func TestLimitReadTimeoutCutsSlowClients(t *testing.T) {
	const readTimeout = 300 * time.Millisecond
	tr := startTestRouter(t, fileConfig{Log: logConfig{Level: "error"}, Pools: limitsPool(t),
		Limits: limitsConfig{ReadTimeout: readTimeout}}, nil)
	addr := strings.TrimPrefix(tr.base, "http://")
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
		"X-Pad: " + strings.Repeat("p", 100) + "\r\n"
	tests := []struct {
		name       string
		fast, slow string // sent at once, then a byte every 20ms
	}{
		{"headers byte by byte", "", head + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(chatBody)) + chatBody},
		{"body byte by byte", head + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(chatBody)), chatBody + strings.Repeat(" ", 100)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			sent := sendSlowly(c, tt.fast, tt.slow, 20*time.Millisecond)
			// A hang guard, not a timing claim.
			c.SetReadDeadline(time.Now().Add(10 * readTimeout))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no response: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestTimeout {
				t.Fatalf("status %d, want 408: %s", resp.StatusCode, b)
			}
			if code, _ := errorCode(string(b)); code != "request_timeout" {
				t.Fatalf("body %s, want an OpenAI error with code request_timeout", b)
			}
			// Which timeout fired: the configured read_timeout, not a default.
			if want := "within " + readTimeout.String(); !strings.Contains(string(b), want) {
				t.Fatalf("body %s does not name the configured read_timeout (%q)", b, want)
			}
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatal("connection still open after the 408")
			}
			c.Close()
			if n := <-sent; n >= len(tt.slow) {
				t.Fatalf("the slow client sent all %d bytes before being cut", n)
			}
		})
	}
	if v := post(context.Background(), http.DefaultClient, tr.base, chatBody, nil); v.status != 200 {
		t.Fatalf("a normal request after the slow ones: %+v", v)
	}
}

// sendSlowly writes fast to c at once, then slow a byte every pace until
// all is sent or a write fails (the router closed the connection). The
// channel receives how many bytes of slow were written.
func sendSlowly(c net.Conn, fast, slow string, pace time.Duration) <-chan int {
	sent := make(chan int, 1)
	go func() {
		n := 0
		if _, err := io.WriteString(c, fast); err == nil {
			for ; n < len(slow); n++ {
				if _, err := c.Write([]byte{slow[n]}); err != nil {
					break
				}
				time.Sleep(pace) // the slow client's pace, not synchronisation
			}
		}
		sent <- n
	}()
	return sent
}

// read_timeout bounds reading the request only: streams and non-streamed
// generations that outlast it are served to the end.
func TestLimitReadTimeoutSparesLongResponses(t *testing.T) {
	const readTimeout = 200 * time.Millisecond
	tr := startTestRouter(t, fileConfig{Log: logConfig{Level: "error"}, Pools: limitsPool(t),
		Limits: limitsConfig{ReadTimeout: readTimeout}}, nil)
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(stream, 300), nil)
			if v.status != 200 || v.errCode != "" || (stream && !v.done) || v.err != nil {
				t.Fatalf("a %v response was cut: %+v", v.duration, v)
			}
			if v.duration < 3*readTimeout {
				t.Fatalf("the response took %v: too short to outlast read_timeout %v", v.duration, readTimeout)
			}
		})
	}
	if n := tr.requests("outcome", "ok"); n != 2 {
		t.Fatalf("router recorded %d ok requests, want 2", n)
	}
}

// Connection max_connections+1 is answered 503 and closed; once one of the
// others closes, new connections are served again.
func TestLimitMaxConnections(t *testing.T) {
	const limit = 4
	tr := startTestRouter(t, fileConfig{Log: logConfig{Level: "error"}, Pools: limitsPool(t),
		Limits: limitsConfig{MaxConnections: limit}}, nil)
	addr := strings.TrimPrefix(tr.base, "http://")
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for i := 0; i < limit; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The listener accepts in order, so the held connections are counted
	// before this one.
	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	over.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(over), nil)
	if err != nil {
		t.Fatalf("connection %d: no refusal: %v", limit+1, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("connection %d: status %d, want 503", limit+1, resp.StatusCode)
	}
	if _, err := over.Read(make([]byte, 1)); err == nil {
		t.Fatalf("connection %d still open after the refusal", limit+1)
	}
	over.Close()

	held[0].Close()
	held = held[1:]
	// The freed slot shows once the server has seen the close: poll with
	// fresh connections that don't keep the slot.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	eventually(t, 5*time.Second, "a freed connection slot was never reused", func() bool {
		resp, err := client.Get(tr.base + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// A pool's max_tokens_limit clamps what a request asks for: the body is
// rewritten (the engine generates no more) and the response says so.
func TestLimitMaxTokensClamp(t *testing.T) {
	const limit = 16
	pools := limitsPool(t)
	pools[0].MaxTokensLimit = limit
	cfg := fileConfig{Log: logConfig{Level: "error"}, Pools: pools}
	tr := startTestRouter(t, cfg, nil)
	usage := `"stream_options":{"include_usage":true},`
	tests := []struct {
		name    string
		body    string
		tokens  int
		clamped bool
	}{
		{"max_tokens above", chatRequest(false, 100), limit, true},
		{"max_tokens below", chatRequest(false, 8), 8, false},
		{"max_tokens at", chatRequest(false, limit), limit, false},
		{"no max_tokens", chatRequest(false, -1), limit, true},
		{"max_completion_tokens above", `{"model":"m","max_completion_tokens":50,"ignore_eos":true,"messages":[{"role":"user","content":"x"}]}`, limit, true},
		{"both above", `{"model":"m","max_tokens":70,"max_completion_tokens":50,"ignore_eos":true,"messages":[{"role":"user","content":"x"}]}`, limit, true},
		{"max_completion_tokens below wins", `{"model":"m","max_tokens":70,"max_completion_tokens":5,"ignore_eos":true,"messages":[{"role":"user","content":"x"}]}`, 5, false},
		{"max_tokens null", `{"model":"m","max_tokens":null,"ignore_eos":true,"messages":[{"role":"user","content":"x"}]}`, limit, true},
		{"stream above", strings.Replace(chatRequest(true, 100), `"ignore_eos"`, usage+`"ignore_eos"`, 1), limit, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tokens, header := completionTokens(t, tr.base, tt.body)
			if tokens != tt.tokens {
				t.Fatalf("%d completion tokens, want %d", tokens, tt.tokens)
			}
			if want := map[bool]string{true: fmt.Sprint(limit)}[tt.clamped]; header != want {
				t.Fatalf("X-Gpurouter-Max-Tokens %q, want %q", header, want)
			}
		})
	}
	t.Run("a key given twice is refused", func(t *testing.T) {
		// The engine would read the last, a rewrite the first: no bypass.
		v := post(context.Background(), http.DefaultClient, tr.base,
			`{"model":"m","max_tokens":1,"max_tokens":100000,"messages":[{"role":"user","content":"x"}]}`, nil)
		if code, _ := errorCode(v.body); v.status != 400 || code != "invalid_request" || !strings.Contains(v.body, `"param":"max_tokens"`) {
			t.Fatalf("client saw %+v, want 400 naming max_tokens", v)
		}
	})
	t.Run("reload changes the cap", func(t *testing.T) {
		next := tr.r.config()
		next.Pools = append([]poolConfig(nil), next.Pools...)
		next.Pools[0].MaxTokensLimit = 4
		if err := tr.r.reload(next); err != nil {
			t.Fatal(err)
		}
		if tokens, _ := completionTokens(t, tr.base, chatRequest(false, 100)); tokens != 4 {
			t.Fatalf("%d completion tokens after the reload, want 4", tokens)
		}
	})
}

// completionTokens sends body and returns the usage's completion tokens
// and the X-Gpurouter-Max-Tokens header.
func completionTokens(t *testing.T, base, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var u struct {
		Usage *struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	for _, doc := range strings.Split(string(b), "\n") {
		doc = strings.TrimPrefix(doc, "data: ")
		if json.Unmarshal([]byte(doc), &u) == nil && u.Usage != nil {
			return u.Usage.CompletionTokens, resp.Header.Get("X-Gpurouter-Max-Tokens")
		}
	}
	t.Fatalf("no usage in the response: %.300s", b)
	return 0, ""
}

// A stream that outlasts timeouts.total ends with an upstream_timeout
// error event and [DONE]; the router records a timeout and the engine's
// sequence is aborted.
func TestLimitTotalDeadlineEndsStream(t *testing.T) {
	const total = 400 * time.Millisecond
	fleet := startSimFleet(t, 1, nil)
	tr := startTestRouter(t, fileConfig{Log: logConfig{Level: "error"}, Timeouts: timeoutsConfig{Total: total},
		Pools: []poolConfig{simPoolConfig(fleet.URLs(), 0)}}, nil)
	v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(true, 1500), nil)
	if v.status != 200 || v.errCode != "upstream_timeout" || !v.done || v.events < 2 {
		t.Fatalf("client saw %+v, want tokens, then an upstream_timeout error event and [DONE]", v)
	}
	if v.duration < total || v.duration > total+time.Second {
		t.Fatalf("stream ended after %v, want about timeouts.total (%v)", v.duration, total)
	}
	if n := tr.requests("outcome", "timeout"); n != 1 {
		t.Fatalf("router recorded %d timeouts, want 1", n)
	}
	eventually(t, 5*time.Second, "the engine kept generating for a stream the router ended", func() bool {
		s := fleet.Replicas()[0].State()
		return s.Running == 0 && s.Waiting == 0
	})
	tr.waitIdle(5 * time.Second)
}
