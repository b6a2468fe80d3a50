package sim

import (
	"context"
	"net"
	"time"
)

func (r *Replica) isDown(now time.Time) bool { return now.UnixNano() < r.downUntil.Load() }

// Crash makes the replica fail like a process killed with kill -9: its
// listener goes away first, so new connects are refused, then every open
// connection is reset (RST, not FIN: idle pooled ones included, streams cut
// mid-way), and the engine loses all requests. After d it listens again and
// comes back empty (with slow start if that fault is set). It needs Serve
// running; without it only the engine is reset.
func (r *Replica) Crash(d time.Duration) {
	now := time.Now()
	r.downUntil.Store(now.Add(d).UnixNano())
	r.mu.Lock()
	r.eng.reset(now)
	r.eng.clearCache(now) // a restarted process's cache is empty
	r.mu.Unlock()
	select {
	case r.crashCh <- d:
	default: // a crash is already pending
	}
}

// Serve answers HTTP on ln until ctx is cancelled, then closes every
// connection and returns once all handlers have finished. A crash closes ln
// and, for TCP listeners, listens on the same address again when the
// downtime is over; other listeners stay open and reset new connections
// while down. Serve also runs the periodic crashes of CrashEverySeconds.
// A replica with a KV connector serves its side channel alongside (bound
// here, on ln's host, unless Fleet.Listen did): it dies and comes back
// with the rest.
func (r *Replica) Serve(ctx context.Context, ln net.Listener) error {
	addr := ln.Addr().String()
	_, isTCP := ln.(*net.TCPListener)
	host, _, err := net.SplitHostPort(addr)
	if err != nil || !isTCP {
		host = "127.0.0.1"
	}
	if err := r.ListenKVSideChannel(host); err != nil {
		return err
	}
	side := r.kvLn // nil without a connector
	for {
		inc := r.newIncarnation()
		srvs := []served{inc.serve(inc.server(), ln)}
		if side != nil {
			srvs = append(srvs, inc.serve(inc.sideServer(), side))
		}
		var down time.Duration
		for {
			var ok bool
			if down, ok = r.awaitCrash(ctx); !ok {
				inc.stop(srvs...)
				return nil
			}
			if isTCP {
				// The listeners go before the connections, so that a
				// client whose pooled connection was just reset finds its
				// reconnect refused, not accepted by a dying server.
				_ = ln.Close()
				if side != nil {
					_ = side.Close()
				}
				inc.closeConns()
				break
			}
			// Can't refuse connections on this listener: keep it, and let
			// the incarnation reset new ones until the downtime is over.
			inc.closeConns()
			if !sleepCtx(ctx, down) {
				inc.stop(srvs...)
				return nil
			}
			r.restarted()
		}
		inc.stop(srvs...)
		if !sleepCtx(ctx, down) {
			return nil
		}
		if ln, err = relisten(ctx, addr); err != nil {
			return nil
		}
		if side != nil {
			if side, err = relisten(ctx, r.KVSideChannelAddr()); err != nil {
				_ = ln.Close()
				return nil
			}
		}
		r.restarted()
	}
}

// relisten listens on addr again after a crash, retrying until ctx ends
// (a port in TIME_WAIT, or taken meanwhile).
func relisten(ctx context.Context, addr string) (net.Listener, error) {
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln, nil
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}

// awaitCrash waits for a crash (Crash, or the next periodic one) and returns
// its downtime; false when ctx ended first. The period of CrashEverySeconds
// runs from the call (a start or restart) and from each change of the
// period.
func (r *Replica) awaitCrash(ctx context.Context) (time.Duration, bool) {
	since := time.Now()
	every := r.Faults().CrashEverySeconds
	for {
		var fire <-chan time.Time
		var t *time.Timer
		if every > 0 {
			t = time.NewTimer(time.Until(since.Add(secondsDur(every))))
			fire = t.C
		}
		var down time.Duration
		crashed, ok := false, true
		select {
		case <-ctx.Done():
			ok = false
		case down = <-r.crashCh:
			crashed = true
		case <-fire:
			// Unless the period changed as the timer fired (a select picks
			// at random among ready cases): then the new one counts.
			if f := r.Faults(); f.CrashEverySeconds == every {
				r.Crash(f.crashDown()) // delivered on crashCh next round
			} else {
				every, since = f.CrashEverySeconds, time.Now()
			}
		case <-r.faultsChanged:
			if f := r.Faults().CrashEverySeconds; f != every {
				every, since = f, time.Now()
			}
		}
		if t != nil {
			t.Stop()
		}
		if !ok || crashed {
			return down, ok
		}
	}
}

func (r *Replica) restarted() {
	r.warmStart.Store(time.Now().UnixNano())
	r.downUntil.Store(0)
}

// sleepCtx sleeps d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
