package proxycost

import (
	"bufio"
	"bytes"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// modeHeader tells the upstream what to answer: a whole JSON reply (the
// default), a stream of events every Interval, or an idle stream that sends
// one event and then waits until released.
const modeHeader = "X-Proxycost-Mode"

const (
	modeSSE  = "sse"
	modeIdle = "idle"
)

// upstream is the fake engine every target forwards to: a fasthttp server
// answering the OpenAI chat API like vLLM does, plus the /health and
// /metrics a router's health checks and telemetry read. Its zero value is
// not usable; build with newUpstream.
type upstream struct {
	interval time.Duration // between two events of a stream
	events   int           // token events per stream
	reply    []byte        // the whole (non-streamed) reply
	now      func() time.Time

	srv      *fasthttp.Server
	ln       net.Listener
	running  atomic.Int64 // streams and requests in progress, for /metrics
	mu       sync.Mutex
	released chan struct{} // closed to end the idle streams; replaced after
}

func newUpstream(interval time.Duration, events int, reply []byte, now func() time.Time) *upstream {
	u := &upstream{interval: interval, events: events, reply: reply, now: now, released: make(chan struct{})}
	u.srv = &fasthttp.Server{
		Handler:               u.handle,
		Name:                  "vllm-lookalike",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		Concurrency:           1 << 16,
	}
	return u
}

// listen starts accepting on addr ("" for a free loopback port); stop
// ends it.
func (u *upstream) listen(addr string) error {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	u.ln = ln
	go u.srv.Serve(ln) //nolint:errcheck // ends with stop
	return nil
}

func (u *upstream) addr() string { return u.ln.Addr().String() }

func (u *upstream) stop() {
	u.release()
	u.srv.Shutdown() //nolint:errcheck
}

// release ends every idle stream open now.
func (u *upstream) release() {
	u.mu.Lock()
	close(u.released)
	u.released = make(chan struct{})
	u.mu.Unlock()
}

func (u *upstream) idleRelease() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.released
}

// chatReply is a chat completion of n bytes (or of its fields alone, when
// n is smaller), as vLLM would send it, its content padded with words.
func chatReply(n int) []byte {
	head := `{"id":"chatcmpl-proxycost","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"`
	return []byte(head + pad(n-len(head)-len(replyEnd)) + string(replyEnd))
}

// replyEnd ends every chatReply: a client that read it read a whole reply.
var replyEnd = []byte(`"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":60,"total_tokens":124,"completion_tokens":64}}`)

func pad(n int) string {
	if n <= 0 {
		return ""
	}
	const words = "lorem ipsum dolor sit amet consectetur adipiscing elit "
	var b bytes.Buffer
	for b.Len() < n {
		b.WriteString(words)
	}
	return b.String()[:n]
}

const metricsText = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} %d
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0
`

func (u *upstream) handle(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		if string(ctx.Path()) == "/metrics" {
			ctx.SetContentType("text/plain; version=0.0.4")
			body := bytes.Replace([]byte(metricsText), []byte("%d"), strconv.AppendInt(nil, u.running.Load(), 10), 1)
			ctx.SetBody(body)
		}
		return // /health and the rest: 200, empty
	}
	mode := string(ctx.Request.Header.Peek(modeHeader))
	if mode != modeSSE && mode != modeIdle {
		ctx.SetContentType("application/json")
		ctx.SetBody(u.reply)
		return
	}
	usage := bytes.Contains(ctx.PostBody(), []byte(`"include_usage":true`))
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	var release <-chan struct{}
	if mode == modeIdle {
		release = u.idleRelease()
	}
	u.running.Add(1)
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer u.running.Add(-1)
		u.stream(w, release, usage)
	})
}

// stream writes one stream's events, each stamped with its send time in
// Unix nanoseconds, flushing each as vLLM does. An idle stream (release
// set) sends one event and waits for release before ending.
func (u *upstream) stream(w *bufio.Writer, release <-chan struct{}, usage bool) {
	n := u.events
	if release != nil {
		n = 1
	}
	var buf []byte
	start := u.now()
	for i := range n {
		if i > 0 {
			// Every event on the schedule, not interval after the last
			// write: a late write must not shift the ones after it.
			if d := start.Add(time.Duration(i) * u.interval).Sub(u.now()); d > 0 {
				time.Sleep(d)
			}
		}
		buf = appendEvent(buf[:0], u.now().UnixNano())
		if _, err := w.Write(buf); err != nil {
			return
		}
		if err := w.Flush(); err != nil {
			return // the client (or the proxy) went away
		}
	}
	if release != nil {
		<-release
	}
	if usage {
		w.WriteString(`data: {"id":"chatcmpl-proxycost","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[],"usage":{"prompt_tokens":60,"total_tokens":` + strconv.Itoa(60+n) + `,"completion_tokens":` + strconv.Itoa(n) + "}}\n\n") //nolint:errcheck
	}
	w.WriteString("data: [DONE]\n\n") //nolint:errcheck
	w.Flush()                         //nolint:errcheck
}

// appendEvent is one token chunk of about 200 bytes, vLLM's shape, with
// its send time in the id.
func appendEvent(b []byte, sentNanos int64) []byte {
	b = append(b, `data: {"id":"chatcmpl-`...)
	b = strconv.AppendInt(b, sentNanos, 10)
	b = append(b, `","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`...)
	return append(b, "\n\n"...)
}

var stampPrefix = []byte(`data: {"id":"chatcmpl-`)

// eventStamp reads the send time of an event line appendEvent wrote; ok is
// false for other lines (usage, [DONE], blank).
func eventStamp(line []byte) (int64, bool) {
	rest, ok := bytes.CutPrefix(line, stampPrefix)
	if !ok {
		return 0, false
	}
	end := bytes.IndexByte(rest, '"')
	if end <= 0 {
		return 0, false
	}
	v, err := strconv.ParseInt(string(rest[:end]), 10, 64)
	return v, err == nil
}
