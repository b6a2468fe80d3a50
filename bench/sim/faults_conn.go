package sim

import (
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// defaultKeepAliveTimeout is uvicorn's --timeout-keep-alive, which vLLM's
// API server runs with.
const defaultKeepAliveTimeout = 5 * time.Second

func (f Faults) keepAliveTimeout() time.Duration {
	if f.KeepAliveTimeoutSeconds <= 0 {
		return defaultKeepAliveTimeout
	}
	return secondsDur(f.KeepAliveTimeoutSeconds)
}

// closeAfterResponse makes this response end its connection the way
// llama.cpp's llama-server does: the headers promise keep-alive, and the
// server closes the connection once the response is written. fasthttp's
// SetConnectionClose would send "Connection: close" and let the client know;
// a hijack with a response doesn't: fasthttp writes and flushes the whole
// response (a stream to its end) and only then hands over the connection,
// which it closes when the hijack handler returns. A handler that drops the
// connection instead (dropConn) overrides this.
// lag (Faults.CloseLagSeconds) holds the connection open, unread, that
// long first.
func closeAfterResponse(ctx *fasthttp.RequestCtx, lag time.Duration) {
	ctx.Response.Header.Set("keep-alive", "timeout=5, max=100")
	ctx.Hijack(func(net.Conn) { time.Sleep(lag) })
}
