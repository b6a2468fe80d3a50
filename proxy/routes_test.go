package proxy

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// requestPath gives fasthttp's Path for every request line, read without
// the URI's parse only where the two cannot differ.
func TestRequestPathIsFasthttps(t *testing.T) {
	for _, uri := range []string{
		"/v1/chat/completions", "/v1/completions", "/health", "/", "/V1/Chat_x-y/9",
		"//v1/chat/completions", "/v1//chat", "/v1/chat/completions?x=1", "/v1/chat/./completions",
		"/v1/x/../chat/completions", "/v1/chat%2Fcompletions", "/v1/chat/completions#f", "/v1/%7Euser",
		"http://host/v1/chat/completions", "*", "/v1/chat/completions/", "/a b", "/v1/chat/..", "/v1/chat+x",
	} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(fasthttp.MethodPost)
		ctx.Request.Header.SetRequestURI(uri)
		ctx.Request.Header.SetHost("router")
		got := string(requestPath(&ctx))
		var want fasthttp.RequestCtx
		want.Request.Header.SetMethod(fasthttp.MethodPost)
		want.Request.Header.SetRequestURI(uri)
		want.Request.Header.SetHost("router")
		if w := string(want.Path()); got != w {
			t.Errorf("%q: requestPath %q, fasthttp's Path %q", uri, got, w)
		}
	}
}
