package proxycost

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// ServeBare runs the floor of the library gpurouter is built on — a
// minimal fasthttp reverse proxy: keep-alive upstream connections,
// streamed bodies, fasthttp's defaults, and nothing else (no parsing,
// metrics, log, admission or watch) — on ln until ctx ends. It is issue
// 15's "bare fasthttp" column: what gpurouter costs beyond it is its own.
func ServeBare(ctx context.Context, ln net.Listener, upstream string) error {
	hc := &fasthttp.HostClient{Addr: upstream, StreamResponseBody: true, MaxConns: 1 << 14, ReadTimeout: 0}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		req := fasthttp.AcquireRequest()
		ctx.Request.CopyTo(req)
		req.SetHost(upstream)
		resp := fasthttp.AcquireResponse()
		err := hc.Do(req, resp)
		fasthttp.ReleaseRequest(req)
		if err != nil {
			fasthttp.ReleaseResponse(resp)
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			return
		}
		resp.Header.CopyTo(&ctx.Response.Header)
		ctx.Response.ImmediateHeaderFlush = true
		ctx.Response.SetBodyStream(&bareBody{resp: resp}, resp.Header.ContentLength())
	}}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return errors.Join(srv.ShutdownWithContext(shut), <-errc)
	}
}

// bareBody relays an upstream body and releases its response when
// fasthttp is done with it.
type bareBody struct{ resp *fasthttp.Response }

func (b *bareBody) Read(p []byte) (int, error) {
	if s := b.resp.BodyStream(); s != nil {
		return s.Read(p)
	}
	return 0, io.EOF
}

func (b *bareBody) Close() error {
	err := b.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(b.resp)
	return err
}
