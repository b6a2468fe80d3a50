//go:build !linux

package proxy

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// streamPump is the stream loop, on Linux only (pump_linux.go): elsewhere
// every stream is relayed on its own goroutine.
type streamPump struct {
	loops int // as pump_linux.go's, which New counts the request loops into
}

func newStreamPump(Config, *metrics, func() time.Time, func(error)) *streamPump {
	return &streamPump{}
}

func (p *streamPump) open() error { return nil }

// registerLoopGauges has no loops to publish.
func registerLoopGauges(prometheus.Registerer, []*streamPump, []*requestLoop) error { return nil }

// Run returns when ctx ends: there is no loop to run.
func (p *streamPump) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// detach never takes a stream from fasthttp here.
func (p *streamPump) detach(*exchange, *fasthttp.Response, net.Conn) fasthttp.ReadCloserWithError {
	return nil
}

// pumpStream has nothing to do: the goroutine relay does it all.
func (r *relay) pumpStream(io.Writer) error { return nil }
