package proxy

import (
	"bufio"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The front door's conformance table: raw HTTP/1.1 requests, as an
// attacker would send them, through both paths — the request loops and
// fasthttp's goroutines (upstream.goroutine_requests) — to a strict engine
// that records every byte it gets (recEngine). Each shape a reader could
// frame otherwise is refused with its status, its connection closed by
// the router, and nothing of it reaches the engine; after each case a
// request on a fresh connection is served as usual. Valid requests,
// chunked ones included, are served on both paths.

// hiddenMark marks the bytes of every request hidden in another's: none
// may reach the engine.
const hiddenMark = "smuggled"

// doorCase is one request's bytes and what the client and the engine
// must see of them: the statuses answered in order, whether the router
// closes the connection, and the API requests the engine gets.
type doorCase struct {
	name     string
	in       string
	statuses []int
	closed   bool
	engine   int
}

const (
	apiHead  = "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
	chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
)

// hidden is a whole request, marked, to hide in another's bytes.
var hidden = func() string {
	body := `{"model":"m","messages":[{"role":"user","content":"` + hiddenMark + `"}]}`
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Hidden: " + hiddenMark + "\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

// chat is a valid chat request with extra field lines before its length.
func chat(fields string) string {
	return apiHead + fields + "Content-Length: " + strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
}

// chunks frames body in chunks of at most n bytes, then the last chunk.
func chunks(body string, n int, last string) string {
	var b strings.Builder
	for len(body) > 0 {
		k := min(n, len(body))
		b.WriteString(strconv.FormatInt(int64(k), 16) + "\r\n" + body[:k] + "\r\n")
		body = body[k:]
	}
	return b.String() + last
}

func refused(name string, status int, in string) doorCase {
	return doorCase{name: name, in: in, statuses: []int{status}, closed: true}
}

func doorCases() []doorCase {
	smuggle := "Content-Length: 5\r\n"
	zero := "\r\n0\r\n\r\n" + hidden // a chunked body of nothing, then the hidden request
	many := strings.Repeat("X-F: 1\r\n", 100)
	return []doorCase{
		// issue 52's seven, and their relatives
		refused("CL then TE", 400, apiHead+smuggle+"Transfer-Encoding: chunked\r\n"+zero),
		refused("TE then CL", 400, apiHead+"Transfer-Encoding: chunked\r\n"+smuggle+zero),
		refused("CL, TE padded by tabs", 400, apiHead+smuggle+"Transfer-Encoding:\t\tchunked\t\r\n"+zero),
		refused("CL, TE folded", 400, apiHead+smuggle+"Transfer-Encoding:\r\n chunked\r\n"+zero),
		refused("GET /v1/models, CL and TE", 400, "GET /v1/models HTTP/1.1\r\nHost: r\r\n"+smuggle+"Transfer-Encoding: chunked\r\n"+zero),
		refused("TE identity without a length", 400, apiHead+"Transfer-Encoding: identity\r\n\r\n"+hidden),
		refused("space in a field name", 400, apiHead+"Content Length: "+strconv.Itoa(len(hidden))+"\r\n\r\n"+hidden),
		refused("field name not a token", 400, chat("X Bad: 1\r\n")),
		refused("Transfer Encoding, not a token", 400, apiHead+"Transfer Encoding: chunked\r\n"+smuggle+"\r\n"+hidden),
		refused("HTTP/0.9", 400, "GET /\r\n"),
		refused("HTTP/0.9 by its version", 505, "GET / HTTP/0.9\r\nHost: r\r\n\r\n"),
		refused("HTTP/2.0", 505, "GET /v1/models HTTP/2.0\r\nHost: r\r\n\r\n"),
		refused("HTTP/1.2", 505, "GET /v1/models HTTP/1.2\r\nHost: r\r\n\r\n"),
		refused("bare LF line ends", 400, strings.ReplaceAll(chat(""), "\r\n", "\n")),
		refused("bare LF in one field", 400, chat("X-A: 1\nX-B: 2\r\n")),
		refused("bare LF after the request line", 400, "POST /v1/chat/completions HTTP/1.1\n"),

		refused("TE chunked, chunked", 400, apiHead+"Transfer-Encoding: chunked, chunked\r\n"+zero),
		refused("TE gzip, chunked", 400, apiHead+"Transfer-Encoding: gzip, chunked\r\n"+zero),
		refused("TE twice", 400, apiHead+"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"+zero),
		refused("TE unknown coding", 501, apiHead+"Transfer-Encoding: x-smuggle\r\n"+zero),
		refused("space before the colon", 400, apiHead+"Transfer-Encoding : chunked\r\n"+zero),
		refused("CL +5", 400, apiHead+"Content-Length: +5\r\n\r\nhello"+hidden),
		refused("CL 5, 5", 400, apiHead+"Content-Length: 5, 5\r\n\r\nhello"+hidden),
		refused("CL twice", 400, apiHead+smuggle+smuggle+"\r\nhello"+hidden),
		refused("CL twice, differing", 400, apiHead+smuggle+"Content-Length: 0\r\n\r\nhello"+hidden),
		refused("CL negative", 400, apiHead+"Content-Length: -1\r\n\r\n"+hidden),
		refused("CL overflowing", 400, apiHead+"Content-Length: 18446744073709551621\r\n\r\n"+hidden),
		refused("chunk size overflowing", 400, apiHead+"Transfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n"+hidden),
		refused("chunk extension too long", 400, apiHead+"Transfer-Encoding: chunked\r\n\r\n5;"+strings.Repeat("x", 2000)+"\r\nhello\r\n0\r\n\r\n"+hidden),
		refused("chunk data without its CRLF", 400, apiHead+"Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"+hidden),
		refused("chunk size ended by LF", 400, apiHead+"Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n"+hidden),
		refused("chunk size not hex", 400, apiHead+"Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n"+hidden),
		refused("NUL in a value", 400, chat("X-A: a\x00b\r\n")),
		refused("control in a value", 400, chat("X-A: a\x1bb\r\n")),
		refused("bare CR in a value", 400, chat("X-A: a\rX-B: b\r\n")),
		refused("obs-fold", 400, chat("X-A: a\r\n b\r\n")),
		refused("fields over the bound", 431, chat(many+"X-F: 1\r\n")),
		refused("head over the bound", 431, chat("X-Big: "+strings.Repeat("y", DefaultMaxHeaderBytes)+"\r\n")),
		refused("no Host", 400, strings.Replace(chat(""), "Host: r\r\n", "", 1)),
		refused("two Hosts", 400, chat("Host: s\r\n")),
		refused("asterisk target for POST", 400, strings.Replace(chat(""), "/v1/chat/completions", "*", 1)),
		refused("target without a form", 400, strings.Replace(chat(""), "/v1/chat/completions", "v1/chat/completions", 1)),
		refused("control in the target", 400, strings.Replace(chat(""), "/v1/chat/completions", "/v1/chat\x01/completions", 1)),
		refused("lowercase version", 400, strings.Replace(chat(""), "HTTP/1.1", "http/1.1", 1)),
		refused("two spaces after the method", 400, strings.Replace(chat(""), "POST ", "POST  ", 1)),
		refused("space before the line end", 400, strings.Replace(chat(""), "HTTP/1.1\r\n", "HTTP/1.1 \r\n", 1)),
		refused("tab between method and target", 400, strings.Replace(chat(""), "POST ", "POST\t", 1)),
		refused("TE in HTTP/1.0", 400, "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"+zero),
		refused("TLS ClientHello", 400, "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03"),
		{name: "hidden behind a valid request", in: chat("") + apiHead + smuggle + "Transfer-Encoding: chunked\r\n" + zero,
			statuses: []int{200, 400}, closed: true, engine: 1},
		{name: "bare LF behind a valid request", in: chat("") + "GET /v1/models HTTP/1.1\nHost: r\n\n",
			statuses: []int{200, 400}, closed: true, engine: 1},

		// served
		{name: "Content-Length body", in: chat(""), statuses: []int{200}, engine: 1},
		{name: "chunked body", in: apiHead + "Transfer-Encoding: chunked\r\n\r\n" + chunks(chatBody, 10, "0\r\n\r\n"), statuses: []int{200}, engine: 1},
		{name: "chunked body, extension and trailer", in: apiHead + "transfer-encoding: Chunked\r\n\r\n" + strings.Replace(chunks(chatBody, 16, "0\r\nX-Trailer: t\r\n\r\n"), "\r\n", ";e=1\r\n", 1),
			statuses: []int{200}, engine: 1},
		{name: "pipelined", in: chat("") + chat(""), statuses: []int{200, 200}, engine: 2},
		{name: "chunked, then pipelined", in: apiHead + "Transfer-Encoding: chunked\r\n\r\n" + chunks(chatBody, 7, "0\r\n\r\n") + chat(""),
			statuses: []int{200, 200}, engine: 2},
		{name: "HTTP/1.0", in: strings.Replace(chat(""), "HTTP/1.1", "HTTP/1.0", 1), statuses: []int{200}, closed: true, engine: 1},
		{name: "absolute form", in: strings.Replace(chat(""), "/v1/chat/completions", "http://r/v1/chat/completions", 1), statuses: []int{200}, engine: 1},
		{name: "an empty line first", in: "\r\n" + chat(""), statuses: []int{200}, engine: 1},
		{name: "every token character in a name", in: chat("X-!#$%&'*+-.^_`|~09az: v\r\nX-Empty:\r\nX-Tab:\tv\t\r\n"), statuses: []int{200}, engine: 1},
		{name: "models", in: "GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n", statuses: []int{200}},
	}
}

// doorPaths are the paths a request may be served on here: fasthttp's
// goroutines, and the request loops where the system has them.
func doorPaths() []bool {
	if haveRequestLoops {
		return []bool{false, true}
	}
	return []bool{true}
}

func TestFrontDoor(t *testing.T) {
	for _, goroutines := range doorPaths() {
		name := "request loop"
		if goroutines {
			name = "goroutine requests"
		}
		t.Run(name, func(t *testing.T) {
			eng := newRecEngine(t)
			tr := startRouter(t, []string{eng.url}, withConfig(func(c *Config) {
				c.GoroutineRequests, c.RequestLoops = goroutines, 1
			}))
			addr := strings.TrimPrefix(tr.url, "http://")
			for _, c := range doorCases() {
				t.Run(c.name, func(t *testing.T) { runDoorCase(t, tr, eng, addr, c) })
			}
			eng.check(t, hiddenMark)
		})
	}
}

// runDoorCase sends c on a fresh connection and holds the router to it,
// then serves a canary request on another.
func runDoorCase(t *testing.T, tr *testRouter, eng *recEngine, addr string, c doorCase) {
	before := eng.apiRequests()
	total := func() float64 {
		var n float64
		for _, st := range []string{"400", "408", "413", "431", "501", "505"} {
			n += testutil.ToFloat64(tr.srv.m.refused.WithLabelValues(st))
		}
		return n
	}
	was := total()
	statuses, body, closed := rawExchange(t, addr, []byte(c.in), len(c.statuses), true)
	if !slices.Equal(statuses, c.statuses) || closed != c.closed {
		t.Fatalf("statuses %v, closed %v (last body %.200q); want %v, closed %v", statuses, closed, body, c.statuses, c.closed)
	}
	if st := c.statuses[len(c.statuses)-1]; st >= 400 {
		if !strings.Contains(body, `"type":"invalid_request_error"`) {
			t.Errorf("refusal body %q: not an OpenAI error", body)
		}
		if n := total() - was; n != 1 {
			t.Errorf("%v refusals counted, want 1", n)
		}
	}
	if n := eng.apiRequests() - before; n != c.engine {
		t.Fatalf("the engine got %d API requests, want %d", n, c.engine)
	}
	if c.engine > 0 {
		if got := eng.lastRequest().body; got != chatBody {
			t.Errorf("the engine got the body %q, want %q", got, chatBody)
		}
	}
	// The canary, on a fresh connection.
	if st, _, _ := rawExchange(t, addr, []byte(chat("")), 1, false); !slices.Equal(st, []int{200}) {
		t.Fatalf("canary after the case: statuses %v", st)
	}
	if n := eng.apiRequests() - before; n != c.engine+1 {
		t.Fatalf("after the canary the engine got %d API requests, want %d", n, c.engine+1)
	}
}

// A chunked request that waits for 100 Continue gets it, on both paths,
// and is served with its body decoded.
func TestFrontDoorChunkedExpectContinue(t *testing.T) {
	for _, goroutines := range doorPaths() {
		eng := newRecEngine(t)
		tr := startRouter(t, []string{eng.url}, withConfig(func(c *Config) {
			c.GoroutineRequests, c.RequestLoops = goroutines, 1
		}))
		c, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
		if _, err := c.Write([]byte(apiHead + "Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		if st, _, err := readResponse(br); err != nil || st != 100 {
			t.Fatalf("goroutines %v: %d, %v; want 100 Continue before the body", goroutines, st, err)
		}
		if _, err := c.Write([]byte(chunks(chatBody, 9, "0\r\n\r\n"))); err != nil {
			t.Fatal(err)
		}
		if st, _, err := readResponse(br); err != nil || st != 200 {
			t.Fatalf("goroutines %v: %d, %v; want 200", goroutines, st, err)
		}
		c.Close()
		if r := eng.lastRequest(); r.body != chatBody || r.fields["expect"] != "" {
			t.Fatalf("goroutines %v: the engine got %q with Expect %q", goroutines, r.body, r.fields["expect"])
		}
	}
}
