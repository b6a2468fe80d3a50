package sim

import (
	"context"
	"sync"
	"time"
)

// maxCatchUp bounds how far behind schedule the real-time loop may run
// before it gives up catching up and restarts a replica's timeline from now
// (after a GC pause or a starved CPU). Lag is measured either way.
const maxCatchUp = 100 * time.Millisecond

// housekeepingInterval paces disconnect checks for requests that have not
// written anything yet (queued, prefilling, non-streaming).
const housekeepingInterval = 25 * time.Millisecond

// Run drives the engine in real time until ctx is cancelled: it schedules a
// step, sleeps until the step's intended end (start + modelled duration /
// speed), applies its outputs, and starts the next step at the intended end,
// so that lateness doesn't accumulate. Each step's lateness (actual −
// intended end) goes to gpurouter_sim_step_lag_seconds and StepLag. It also
// runs housekeeping: disconnect checks for requests still silent, metric
// snapshots for the stale-metrics fault, GPU utilisation. On return every
// request has been aborted. Run may be called once, and not for a replica
// whose fleet runs (Fleet.Run drives all its replicas from one goroutine).
func (r *Replica) Run(ctx context.Context) error { return runReplicas(ctx, []*Replica{r}) }

// runReplicas drives the engines of rs from a single goroutine, and their
// housekeeping from one more. One driver for many replicas keeps the timing
// honest on few cores: when a step ends, its replica wakes hundreds of
// stream writers, and the Go scheduler would queue another replica's
// separate loop goroutine behind all of them.
func runReplicas(ctx context.Context, rs []*Replica) error {
	for i, r := range rs {
		r.mu.Lock()
		again := r.running
		r.running = true
		r.mu.Unlock()
		if again {
			for _, prev := range rs[:i] {
				prev.mu.Lock()
				prev.running = false
				prev.mu.Unlock()
			}
			return errRunTwice
		}
	}
	wake := make(chan struct{}, 1)
	for _, r := range rs {
		r.wake.Store(&wake)
		r.warmStart.Store(time.Now().UnixNano())
	}
	hctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		housekeeping(hctx, rs)
	}()
	for _, r := range rs {
		if r.pub != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = r.pub.Run(hctx) // binds first unless the fleet did
			}()
		}
	}
	defer func() {
		cancel()
		wg.Wait()
		for _, r := range rs {
			r.pulls.Wait() // they end with ctx
			r.mu.Lock()
			r.eng.reset(time.Now())
			r.mu.Unlock()
			close(r.stopped)
		}
	}()
	drive(ctx, rs, wake, rs[0].cfg.spinWait())
	return nil
}

// slot is one replica's place in the driver loop.
type slot struct {
	r    *Replica
	busy bool      // a step is in flight
	next time.Time // intended start of the next step; zero when idle
	end  time.Time // intended end of the step in flight
	d    time.Duration
}

// drive is the real-time loop: complete the steps that are due, start the
// next ones, sleep until the earliest end. Go's timers wake with about 1 ms
// granularity on Linux (netpoll waits in whole milliseconds), so the loop
// sleeps until spin before the end and busy-waits the rest.
func drive(ctx context.Context, rs []*Replica, wake <-chan struct{}, spin time.Duration) {
	slots := make([]slot, len(rs))
	for i, r := range rs {
		slots[i].r = r
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		for i := range slots {
			if s := &slots[i]; s.busy && !time.Now().Before(s.end) {
				s.complete()
			}
		}
		var earliest time.Time
		for i := range slots {
			s := &slots[i]
			if !s.busy {
				s.start(ctx, time.Now())
			}
			if s.busy && (earliest.IsZero() || s.end.Before(earliest)) {
				earliest = s.end
			}
		}
		if earliest.IsZero() {
			select {
			case <-wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		until := time.Until(earliest)
		if until <= spin {
			for time.Now().Before(earliest) && len(wake) == 0 && ctx.Err() == nil {
			}
			continue
		}
		timer.Reset(until - spin)
		select {
		case <-timer.C:
		case <-wake:
			timer.Stop()
		case <-ctx.Done():
			timer.Stop()
			return
		}
	}
}

// start schedules the replica's next step, if it has work, and starts the
// KV reads the scheduler decided (they run until ctx ends at the latest).
func (s *slot) start(ctx context.Context, now time.Time) {
	base := s.next
	if base.IsZero() || now.Sub(base) > maxCatchUp {
		base = now
	}
	r := s.r
	r.mu.Lock()
	d := r.eng.schedule(base)
	pulls := r.eng.takePulls()
	r.mu.Unlock()
	if len(pulls) > 0 {
		r.startPulls(ctx, pulls)
	}
	if d == 0 {
		s.next = time.Time{}
		return
	}
	s.d = time.Duration(float64(d) / r.speedFactor(base))
	s.end = base.Add(s.d)
	s.busy = true
}

// complete applies the step in flight, recording how late it is.
func (s *slot) complete() {
	r := s.r
	actual := time.Now()
	lag := max(actual.Sub(s.end), 0)
	r.m.stepLag.Observe(lag.Seconds())
	r.m.stepDuration.Observe(s.d.Seconds())
	r.m.steps.Inc()
	r.busyNanos.Add(int64(s.d))
	r.mu.Lock()
	r.lag.add(lag)
	r.eng.complete(actual)
	r.mu.Unlock()
	s.busy = false
	s.next = s.end
}

// kick wakes the driver if it is idle.
func (r *Replica) kick() {
	if w := r.wake.Load(); w != nil {
		select {
		case *w <- struct{}{}:
		default:
		}
	}
}

func housekeeping(ctx context.Context, rs []*Replica) {
	t := time.NewTicker(housekeepingInterval)
	defer t.Stop()
	var lastSnap time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			snap := now.Sub(lastSnap) >= time.Second
			if snap {
				lastSnap = now
			}
			for _, r := range rs {
				r.sweepDisconnected()
				r.expireKV(now)
				if snap {
					r.expo.snapshot(now)
					r.gpuMeter.sample(now, r.busyNanos.Load())
				}
			}
		}
	}
}

// sweepDisconnected aborts requests whose client has gone away before the
// replica wrote anything to it: fasthttp only notices a disconnect on a
// failed write, and nothing is written while a request is queued or
// prefilling, or for a non-streaming request until it is done. vLLM notices
// through the ASGI disconnect event and aborts; so do we, within
// housekeepingInterval for up to sweepBatch silent requests (one cheap
// syscall each), round-robin beyond that.
func (r *Replica) sweepDisconnected() {
	for _, q := range r.waiting.sweep(sweepBatch, func(q *request) bool { return q.conn != nil && peerClosed(q.conn) }) {
		q.disconnected()
	}
}

// expireKV frees held KV blocks nobody read in time (a prefill replica).
func (r *Replica) expireKV(now time.Time) {
	if r.eng.kvx == nil {
		return
	}
	r.mu.Lock()
	r.eng.expireHeld(now)
	r.mu.Unlock()
}

// sweepBatch bounds the disconnect checks per replica per housekeeping tick.
const sweepBatch = 128

func (r *Replica) watch(q *request)   { r.waiting.add(q) }
func (r *Replica) unwatch(q *request) { r.waiting.remove(q) }

// waitSet holds the requests that have not written anything yet, for the
// disconnect sweep. The zero value is empty and ready.
type waitSet struct {
	mu     sync.Mutex // guards items, cursor and every member's widx
	items  []*request
	cursor int
}

func (w *waitSet) add(q *request) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if q.widx > 0 {
		return
	}
	w.items = append(w.items, q)
	q.widx = len(w.items) // 1-based: 0 means not in the set
}

func (w *waitSet) remove(q *request) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removeLocked(q)
}

func (w *waitSet) removeLocked(q *request) {
	i := q.widx - 1
	if i < 0 {
		return
	}
	last := w.items[len(w.items)-1]
	w.items[i], last.widx = last, i+1
	w.items[len(w.items)-1] = nil
	w.items = w.items[:len(w.items)-1]
	q.widx = 0
}

func (w *waitSet) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.items)
}

// sweep checks up to n members, continuing where the last sweep stopped,
// and removes and returns those for which gone is true.
func (w *waitSet) sweep(n int, gone func(*request) bool) []*request {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*request
	n = min(n, len(w.items))
	for k := 0; k < n; k++ {
		q := w.items[(w.cursor+k)%len(w.items)]
		if gone(q) {
			out = append(out, q)
		}
	}
	if len(w.items) > 0 {
		w.cursor = (w.cursor + n) % len(w.items)
	}
	for _, q := range out {
		w.removeLocked(q)
	}
	return out
}
