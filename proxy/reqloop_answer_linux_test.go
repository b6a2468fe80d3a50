//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/proxy/observe"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// An answer a request loop relays from its bytes (rawAnswer) reaches the
// client byte for byte as fasthttp's path gives it — fasthttp's goroutine
// per connection — but for the Date field's value; it is accounted the
// same (the access log line); and an answer that needs fasthttp's header
// takes the loop's parse, which gives the same bytes too.
func TestRequestLoopRawAnswersAreFasthttps(t *testing.T) {
	const body = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}`
	reply := func(fields string, b string) string {
		return "HTTP/1.1 200 OK\r\n" + fields + "content-length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + b
	}
	const uvicorn = "date: Fri, 27 Nov 2026 09:00:00 GMT\r\nserver: uvicorn\r\n"
	const jsonType = "content-type: application/json\r\n"
	for _, tc := range []struct {
		name   string
		reply  string
		client string // the client's extra request fields
		raw    bool   // relayed from its bytes
	}{
		{"vLLM's", reply(uvicorn+jsonType, body), "", true},
		{"more fields", reply("Cache-Control: no-store\r\nx-custom-FIELD: a, b\r\nKEEP-ALIVE: timeout=5\r\nConnection: keep-alive\r\nx-empty:\r\nContent-Type: application/json; charset=utf-8\r\n", body), "", true},
		{"engine closes", reply(jsonType+"Connection: close\r\n", body), "", true},
		{"client closes", reply(jsonType, body), "Connection: close\r\n", true},
		{"malformed JSON", reply(jsonType, `{"id":`), "", true},
		{"usage unnoted", reply(jsonType, `{"a\u0062":1,"usage":{"prompt_tokens":3,"completion_tokens":4}}`), "", true},
		{"repeated field", reply(jsonType+"x-dup: a\r\nX-Dup: b\r\n", body), "", false},
		{"cookie", reply(jsonType+"Set-Cookie: a=b; Path=/\r\n", body), "", false},
		{"engine's request id", reply(jsonType+"X-Request-Id: engine\r\n", body), "", false},
		{"encoding", reply(jsonType+"Content-Encoding: identity\r\n", body), "", false},
		{"no type", reply("", body), "", false},
		{"not 200", "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}", "", false},
		{"chunked", "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n" +
			strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := answerEngine(t, func() string { return tc.reply })
			var answers, lines []string
			for _, path := range []string{"loop", "goroutines"} {
				logs := &lockedBuffer{}
				log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(observe.LogEncoderConfig()), zapcore.AddSync(logs), zap.InfoLevel))
				tr := startRouterWith(t, []string{up}, func(o *Options) { o.Logger, o.AccessLog = log, logs },
					withConfig(func(c *Config) {
						c.RequestLoops, c.GoroutineRequests = 1, path == "goroutines"
					}))
				answers = append(answers, askRaw(t, tr.url, tc.client))
				waitFor(t, "the access log line", func() bool { return requestLine(logs.String()) != "" })
				lines = append(lines, comparableLine(t, requestLine(logs.String())))
				if path == "loop" {
					raw, parsed := testutil.ToFloat64(tr.srv.m.rawAnswers), testutil.ToFloat64(tr.srv.m.parsedAnswers)
					if want := map[bool]float64{true: 1}[tc.raw]; raw != want || raw+parsed != 1 {
						t.Errorf("%v answers relayed from their bytes, %v parsed; want %v from their bytes", raw, parsed, want)
					}
				}
			}
			if answers[0] != answers[1] {
				t.Errorf("the client's answer differs from the goroutine path's:\nloop %q\ngoro %q", answers[0], answers[1])
			}
			if lines[0] != lines[1] {
				t.Errorf("the access log line differs from the goroutine path's:\nloop %s\ngoro %s", lines[0], lines[1])
			}
		})
	}
}

// answerEngine answers every request on its connections with reply(),
// keeping them open (but after a reply that says it closes).
func answerEngine(t *testing.T, reply func() string) string {
	return loopbackServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			c.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body) //nolint:errcheck
			r := reply()
			if _, err := io.WriteString(c, r); err != nil || strings.Contains(r, "Connection: close") {
				return
			}
		}
	})
}

var dateField = regexp.MustCompile(`\r\nDate: [^\r]*\r\n`)

// askRaw sends one chat request with a fixed request id and returns the
// answer's bytes as they came, the Date field's value blanked.
func askRaw(t *testing.T, url, fields string) string {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nX-Request-Id: fixed-id\r\n"+ //nolint:errcheck
		fields+"Content-Length: "+strconv.Itoa(len(chatPlain))+"\r\n\r\n"+chatPlain)
	c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
	var got bytes.Buffer
	resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(c, &got)), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	return dateField.ReplaceAllString(got.String(), "\r\nDate: -\r\n")
}

// requestLine is the log's access log line ("" while it has none).
func requestLine(log string) string {
	for l := range strings.Lines(log) {
		if strings.Contains(l, `"msg":"request"`) {
			return l
		}
	}
	return ""
}

// comparableLine is an access log line without its times.
func comparableLine(t *testing.T, log string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(log)), &m); err != nil {
		t.Fatalf("access log %q: %v", log, err)
	}
	for k, v := range m {
		if _, isNum := v.(float64); isNum && k != "status" && k != "attempts" && !strings.HasSuffix(k, "_tokens") || k == "ts" {
			delete(m, k)
		}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// Engine heads drawn at random from fields an engine or a proxy in front
// of it may send, in any case and order, some repeated: the loop (from
// the engine's bytes, or through its parse) and fasthttp's goroutine path
// give the client the same bytes, and the loop relays from their bytes
// those whose fields are plain.
func TestRequestLoopRawAnswersOfRandomHeads(t *testing.T) {
	const body = `{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`
	names := []string{"x-a", "X-A", "cache-control", "Vary", "x-b-c", "ETAG", "keep-alive", "Connection", "server", "Date",
		"x-empty", "Access-Control-Allow-Origin", "x-request-id", "Set-Cookie", "content-encoding", "X-Gpurouter-Max-Tokens"}
	values := []string{"1", "a, b", "", "no-store", "close", "keep-alive", "timeout=5", "W/\"x\"", "*", "a=b; Path=/", "a\x7fb", "é"}
	var reply atomic.Value
	up := answerEngine(t, func() string { return reply.Load().(string) })
	// One of each path whatever GPUROUTER_TEST_GOROUTINE_REQUESTS says.
	raw := startRouter(t, []string{up}, oneLoop)
	parsed := startRouter(t, []string{up}, withConfig(func(c *Config) { c.GoroutineRequests = true }))
	rng := rand.New(rand.NewPCG(15, 2026))
	rawTaken := 0
	for i := range 60 {
		var fields strings.Builder
		for range rng.IntN(6) {
			fields.WriteString(names[rng.IntN(len(names))] + ": " + values[rng.IntN(len(values))] + "\r\n")
		}
		if rng.IntN(4) > 0 {
			fields.WriteString("Content-Type: application/json\r\n")
		}
		reply.Store("HTTP/1.1 200 OK\r\n" + fields.String() + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
		before := testutil.ToFloat64(raw.srv.m.rawAnswers)
		a, b := askRaw(t, raw.url, ""), askRaw(t, parsed.url, "")
		if a != b {
			t.Errorf("head %d %q:\nloop       %q\ngoroutines %q", i, fields.String(), a, b)
		}
		rawTaken += int(testutil.ToFloat64(raw.srv.m.rawAnswers) - before)
	}
	t.Logf("%d of 60 relayed from their bytes", rawTaken)
	if rawTaken < 10 || rawTaken > 50 {
		t.Errorf("%d of 60 answers relayed from their bytes: the draw should give both paths many", rawTaken)
	}
}
