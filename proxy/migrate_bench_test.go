package proxy

import (
	"bytes"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// tokenIDUpstream streams n chunks as vLLM 0.10.2+ does with
// return_token_ids: the prompt's ids in the first chunk, each chunk's own
// in its choice. No per-request allocation of its own.
func tokenIDUpstream(b *testing.B, events int) string {
	b.Helper()
	var sse bytes.Buffer
	sse.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3,4,5]}` + "\n\n")
	for i := 0; i < events-1; i++ {
		sse.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok "},"logprobs":null,"finish_reason":null,"token_ids":[30001]}]}` + "\n\n")
	}
	sse.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":260,"completion_tokens":255}}` + "\n\ndata: [DONE]\n\n")
	stream := sse.Bytes()
	return serveBench(b, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBody(stream)
	})
}

// BenchmarkProxyStreamPerEventMigratable is BenchmarkProxyStreamPerEvent
// over an engine returning token ids, with migration off and on: on, every
// event is also tracked (text and token ids kept, the ids the router asked
// for removed from what the client sees). ns/op and allocs/op are per
// relayed event; allocs must stay 0.
func BenchmarkProxyStreamPerEventMigratable(b *testing.B) {
	for _, max := range []int{0, 1} {
		b.Run(map[int]string{0: "off", 1: "on"}[max], func(b *testing.B) { benchTokenIDStream(b, max) })
	}
}

func benchTokenIDStream(b *testing.B, max int) {
	const events = 256
	tr := startRouterWith(b, []string{tokenIDUpstream(b, events)}, withMigration(Migration{Max: max}), withPolicy("least_request"))
	b.Cleanup(func() { tr.srv.Shutdown(b.Context()) }) //nolint:errcheck
	c := &fasthttp.HostClient{Addr: strings.TrimPrefix(tr.url, "http://"), MaxConns: 64}
	benchStream(b, c, events, func(body []byte) {
		if max > 0 && bytes.Contains(body, []byte("token_ids")) {
			b.Fatalf("token ids reached the client: %.300s", body)
		}
	})
}

// BenchmarkMigrationTrack is one event through the tracking alone: find the
// text and token ids, keep them, strip the ids.
func BenchmarkMigrationTrack(b *testing.B) {
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok "},"logprobs":null,"finish_reason":null,"token_ids":[30001]}]}` + "\n\n")
	m := &migration{pol: Migration{Max: 1, MaxSeqLen: 1 << 30}, chat: true, strip: true, idsOK: true, buf: &migBuffers{}}
	dst := make([]byte, 0, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		dst, _ = m.token(dst[:0], ev)
		if len(m.buf.text) > 1<<20 {
			m.buf.reset()
		}
	}
}
