//go:build !linux

package proxy

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"
)

// haveRequestLoops: Linux only.
const haveRequestLoops = false

// requestLoop is the request loop, Linux only (reqloop_linux.go):
// elsewhere every request is served on fasthttp's goroutines.
type requestLoop struct{ size atomic.Int64 }

func newRequestLoop(*Server, func() time.Time) *requestLoop { return &requestLoop{} }

func (l *requestLoop) open() error { return errors.New("proxy: request loops need Linux") }

func (l *requestLoop) Run(context.Context) error { return l.open() }

func (l *requestLoop) take(net.Conn) bool { return false }

func (l *requestLoop) poke() {}
