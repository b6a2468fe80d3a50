package proxy

import (
	"context"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The server's loops, started by Serve and stopped by Shutdown: the
// request loops (reqloop_linux.go), which serve API requests without a
// goroutine each where the system has them, and the stream loops
// (pump_linux.go), which relay streams' events.

// runRequestLoops opens the request loops and runs them until ctx ends;
// the channel closes once all have stopped. A loop that can't open is
// left out: its share of connections goes to fasthttp.
func (s *Server) runRequestLoops(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range s.reqLoops {
		if err := l.open(); err != nil {
			s.log.Warn("no request loop: its connections are served on goroutines", zap.Error(err))
			continue
		}
		wg.Go(func() {
			if err := l.Run(ctx); err != nil {
				s.log.Warn("request loop stopped: new connections are served on goroutines", zap.Error(err))
			}
		})
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

// batchOff logs, once, that loops make a system call for each stream
// read and write: the kernel refused io_uring, or a ring failed (err).
func (s *Server) batchOff(err error) {
	s.batchLog.Do(func() {
		s.log.Info("loops' reads and writes are not batched: io_uring refused or failed, each is a system call", zap.Error(err))
	})
}

// takeConn gives an accepted connection to the next request loop.
func (s *Server) takeConn(c net.Conn) bool {
	return s.reqLoops[s.nextLoop.Add(1)%uint64(len(s.reqLoops))].take(c)
}

// wakeRequestLoops has the request loops scan now: a quiet loop sleeps
// until its first idle connection expires, and a drain must not wait for
// that.
func (s *Server) wakeRequestLoops() {
	for _, l := range s.reqLoops {
		l.poke()
	}
}

// loopClients is the client connections in the request loops.
func (s *Server) loopClients() int64 {
	var n int64
	for _, l := range s.reqLoops {
		n += l.size.Load()
	}
	return n
}

// waitRequestLoops waits, while the router drains, until the request
// loops hold no connection: they close idle ones and answer the rest
// with Connection: close, and abort them when the drain deadline passes.
func (s *Server) waitRequestLoops() {
	for s.draining.Load() && s.loopClients() > 0 {
		time.Sleep(10 * time.Millisecond)
	}
}

// runStreamLoops opens the stream loops, before the first connection
// comes, and runs them until ctx ends; the channel closes once all have
// stopped. Without them (GoroutineStreams, or loops that can't open) every
// stream runs on its own goroutine.
func (s *Server) runStreamLoops(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range s.pumps {
		if s.cfg.GoroutineStreams {
			break
		}
		if err := p.open(); err != nil {
			s.log.Warn("no stream loop: streams relayed on goroutines", zap.Error(err))
			break
		}
		wg.Go(func() {
			if err := p.Run(ctx); err != nil {
				s.log.Warn("stream loop stopped: its streams go on on goroutines", zap.Error(err))
			}
		})
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

// pump is the stream loop a new stream goes to, in turn.
func (s *Server) pump() *streamPump {
	return s.pumps[s.nextPump.Add(1)%uint64(len(s.pumps))]
}
