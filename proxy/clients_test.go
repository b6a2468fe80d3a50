package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/proxy/auth"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// authRouter is a router over one fake engine with keys alpha (every
// model, 3 requests/min), beta (only "other") and gamma (300 tokens/min),
// a settable clock and a debug-level log.
func authRouter(t *testing.T) (*testRouter, *fakeVLLM, *keyClock, *lockedBuffer) {
	t.Helper()
	up := newFakeVLLM(t)
	clock := &keyClock{}
	clock.ns.Store(time.Unix(1_700_000_000, 0).UnixNano())
	ks, err := auth.NewKeyStore([]auth.KeyConfig{
		{ID: "alpha", Hash: auth.HashKey(keyAlpha), RequestsPerMinute: 3, Tier: 1},
		{ID: "beta", Hash: auth.HashKey(keyBeta), Models: []string{"other"}},
		{ID: "gamma", Hash: auth.HashKey(keyGamma), TokensPerMinute: 300},
	}, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	log := zap.New(zapcore.NewCore(enc, zapcore.AddSync(logs), zapcore.DebugLevel))
	tr := startRouterWith(t, []string{up.url}, func(o *Options) { o.Keys, o.Logger = ks, log })
	return tr, up, clock, logs
}

// The keys' raw values, which must never show up in logs or metrics.
const (
	keyAlpha = "sk-alpha-1f0c9e4b7a2d4c8e9b3a6f5d2c1e0b9a"
	keyBeta  = "sk-beta-77d2a1c4e5f60718293a4b5c6d7e8f90"
	keyGamma = "sk-gamma-5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
	keyWrong = "sk-wrong-0000000000000000000000000000dead"
)

// keyClock is the keys' rate limits' clock, set by the test.
type keyClock struct{ ns atomic.Int64 }

func (c *keyClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *keyClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func getWith(t *testing.T, url string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// Header names are case-insensitive: Node's fetch and Envoy sidecars send
// them in lower case. The key and the request id must both be seen.
func TestHeaderNamesInAnyCase(t *testing.T) {
	tr, up, _, logs := authRouter(t)
	c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
	br := bufio.NewReader(c)
	for i, name := range []string{"authorization", "AUTHORIZATION", "Authorization"} {
		id := fmt.Sprintf("case-%d", i)
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"+
			"%s: Bearer %s\r\nx-request-id: %s\r\ncontent-length: %d\r\n\r\n%s",
			name, keyAlpha, id, len(chatPlain), chatPlain)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != id {
			t.Fatalf("%s: %d with X-Request-Id %q, want 200 and %q", name, resp.StatusCode, resp.Header.Get("X-Request-Id"), id)
		}
		if got := (<-up.received).Header.Get("X-Request-Id"); got != id {
			t.Errorf("%s: the engine got X-Request-Id %q, want %q", name, got, id)
		}
	}
	waitFor(t, "the requests to finish", func() bool { return tr.srv.Active() == 0 })
	if n := strings.Count(logs.String(), `"key_id":"alpha"`); n != 3 {
		t.Errorf("%d access log lines name key alpha, want 3", n)
	}
}

func TestAuthEndToEnd(t *testing.T) {
	tr, up, clock, _ := authRouter(t)
	chat := tr.url + "/v1/chat/completions"
	tests := []struct {
		name   string
		key    string // "" sends no Authorization
		body   string
		status int
		code   string
	}{
		{"no key", "", chatPlain, 401, "invalid_api_key"},
		{"wrong key", keyWrong, chatPlain, 401, "invalid_api_key"},
		{"no key, bad body: 401 before parsing", "", `{"model":`, 401, "invalid_api_key"},
		{"no key, unknown model: no model list leaks", "", `{"model":"nope","messages":[]}`, 401, "invalid_api_key"},
		{"model not allowed", keyBeta, chatPlain, 403, "model_not_allowed"},
		{"valid key", keyAlpha, chatPlain, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.key != "" {
				hdr = []string{"Authorization", "Bearer " + tt.key}
			}
			resp := post(t, chat, tt.body, hdr...)
			defer resp.Body.Close()
			if resp.StatusCode != tt.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, b)
			}
			if tt.code == "" {
				io.Copy(io.Discard, resp.Body) //nolint:errcheck
				return
			}
			if e := decodeError(t, resp); e.Error.Code != tt.code || e.Error.Type != "invalid_request_error" {
				t.Fatalf("error %+v, want code %s", e.Error, tt.code)
			}
			if tt.status == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
	if n := up.requests.Load(); n != 1 {
		t.Fatalf("engine got %d requests, want only the authorised one", n)
	}
	if h := <-up.headers; h.Get("Authorization") != "" {
		t.Fatal("the client's API key was forwarded to the engine")
	}

	t.Run("request rate limit", func(t *testing.T) {
		// alpha allows 3 a minute and has used one above.
		for i := range 2 {
			resp := post(t, chat, chatPlain, "Authorization", "Bearer "+keyAlpha)
			io.Copy(io.Discard, resp.Body) //nolint:errcheck
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d", i+2, resp.StatusCode)
			}
		}
		resp := post(t, chat, chatPlain, "Authorization", "Bearer "+keyAlpha)
		defer resp.Body.Close()
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "20" {
			t.Fatalf("4th request: %d Retry-After %q, want 429 and 20", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if e := decodeError(t, resp); e.Error.Code != "rate_limit_exceeded" || e.Error.Type != "rate_limit_error" {
			t.Fatalf("error %+v", e.Error)
		}
		clock.Advance(20 * time.Second)
		resp2 := post(t, chat, chatPlain, "Authorization", "Bearer "+keyAlpha)
		io.Copy(io.Discard, resp2.Body) //nolint:errcheck
		resp2.Body.Close()
		if resp2.StatusCode != 200 {
			t.Fatalf("after Retry-After: %d", resp2.StatusCode)
		}
	})

	t.Run("token rate limit", func(t *testing.T) {
		// gamma allows 300 estimated tokens a minute: max_tokens 200 plus
		// the prompt fits once, not twice.
		body := `{"model":"m","max_tokens":200,"messages":[{"role":"user","content":"hi"}]}`
		resp := post(t, chat, body, "Authorization", "Bearer "+keyGamma)
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("first: %d", resp.StatusCode)
		}
		resp = post(t, chat, body, "Authorization", "Bearer "+keyGamma)
		defer resp.Body.Close()
		ra := resp.Header.Get("Retry-After")
		if resp.StatusCode != 429 || ra == "" || ra == "0" {
			t.Fatalf("second: %d Retry-After %q, want 429 with a wait", resp.StatusCode, ra)
		}
		if e := decodeError(t, resp); !strings.Contains(e.Error.Message, "300 tokens per minute") {
			t.Fatalf("message %q", e.Error.Message)
		}
	})

	t.Run("models needs a key and lists the key's models", func(t *testing.T) {
		resp := getWith(t, tr.url+"/v1/models")
		if resp.StatusCode != 401 {
			t.Fatalf("no key: %d", resp.StatusCode)
		}
		resp.Body.Close()
		for key, want := range map[string]string{keyAlpha: `"id":"m-alias"`, keyBeta: `"data":[]`} {
			resp := getWith(t, tr.url+"/v1/models", "Authorization", "Bearer "+key)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
				t.Fatalf("%d %s, want 200 with %s", resp.StatusCode, b, want)
			}
		}
	})

	t.Run("operator endpoints stay open", func(t *testing.T) {
		for _, path := range []string{"/health", "/ready", "/metrics"} {
			resp := getWith(t, tr.url+path)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("%s: %d", path, resp.StatusCode)
			}
		}
	})
}

func TestAuthNoKeyMaterialInLogsOrMetrics(t *testing.T) {
	tr, _, _, logs := authRouter(t)
	chat := tr.url + "/v1/chat/completions"
	send := func(key, body string, hdr ...string) int {
		if key != "" {
			hdr = append(hdr, "Authorization", "Bearer "+key)
		}
		resp := post(t, chat, body, hdr...)
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp.StatusCode
	}
	got := []int{
		send(keyAlpha, chatPlain),   // ok
		send(keyAlpha, chatStream),  // ok, streamed
		send(keyWrong, chatPlain),   // unknown key
		send("", chatPlain),         // no key
		send(keyBeta, chatPlain),    // model not allowed
		send(keyAlpha, chatPlain),   // ok (3rd of 3)
		send(keyAlpha, chatPlain),   // rate limited
		send(keyAlpha, `{"model":`), // authenticated, bad body
	}
	want := []int{200, 200, 401, 401, 403, 200, 429, 400}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
	for _, key := range []string{keyAlpha, keyBeta, keyWrong} {
		resp := getWith(t, tr.url+"/v1/models", "Authorization", "Bearer "+key)
		resp.Body.Close()
	}
	// A request fasthttp cannot parse, with a key in its headers: its
	// error must not quote the request.
	conn, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: zz\r\n\r\n", keyGamma)
	bufio.NewReader(conn).ReadString('\n') //nolint:errcheck
	conn.Close()

	waitFor(t, "the streamed request's access log line", func() bool {
		return strings.Count(logs.String(), `"msg":"request"`) >= 8
	})
	resp := getWith(t, tr.url+"/metrics")
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	for name, text := range map[string]string{"log": logs.String(), "metrics": string(metrics)} {
		for _, secret := range []string{keyAlpha, keyBeta, keyGamma, keyWrong, "Bearer", "bearer"} {
			if strings.Contains(text, secret) {
				t.Errorf("%s output contains %q:\n%s", name, secret, text)
			}
		}
		// Only the parts after "sk-": a key must not leak in pieces either.
		for _, secret := range []string{keyAlpha[9:], keyGamma[9:], keyWrong[9:]} {
			if strings.Contains(text, secret) {
				t.Errorf("%s output contains part of a key", name)
			}
		}
	}
	for _, want := range []string{`"key_id":"alpha"`, `"key_id":"beta"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("access log lacks %s", want)
		}
	}
	for _, want := range []string{
		`gpurouter_auth_requests_total{key_id="alpha",result="ok"} 3`,
		`gpurouter_auth_requests_total{key_id="alpha",result="rate_limited_requests"} 1`,
		`gpurouter_auth_requests_total{key_id="beta",result="forbidden"} 1`,
		`gpurouter_auth_requests_total{key_id="",result="unauthorized"} 3`,
		`outcome="rate_limited"`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
