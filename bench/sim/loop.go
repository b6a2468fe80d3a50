package sim

import (
	"context"
	"sync"
	"time"
)

// maxCatchUp bounds how far behind schedule the real-time loop may run
// before it gives up catching up and restarts its timeline from now (after a
// GC pause or a starved CPU). Lag is measured either way.
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
// request has been aborted. Run may be called once.
func (r *Replica) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return errRunTwice
	}
	r.running = true
	r.mu.Unlock()
	defer close(r.stopped)

	hctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.housekeeping(hctx)
	}()
	defer func() {
		cancel()
		wg.Wait()
		r.mu.Lock()
		r.eng.reset(time.Now())
		r.mu.Unlock()
	}()

	r.warmStart.Store(time.Now().UnixNano())
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var next time.Time // intended start of the next step; zero when idle
	for {
		r.mu.Lock()
		now := time.Now()
		if next.IsZero() || now.Sub(next) > maxCatchUp {
			next = now
		}
		d := r.eng.schedule(next)
		r.mu.Unlock()
		if d == 0 {
			next = time.Time{}
			select {
			case <-r.wake:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		d = time.Duration(float64(d) / r.speedFactor(next))
		end := next.Add(d)
		timer.Reset(time.Until(end))
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil
		}
		actual := time.Now()
		lag := max(actual.Sub(end), 0)
		r.m.stepLag.Observe(lag.Seconds())
		r.m.stepDuration.Observe(d.Seconds())
		r.m.steps.Inc()
		r.busyNanos.Add(int64(d))
		r.mu.Lock()
		r.lag.add(lag)
		r.eng.complete(actual)
		r.mu.Unlock()
		next = end
	}
}

// kick wakes Run if it is idle.
func (r *Replica) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Replica) housekeeping(ctx context.Context) {
	t := time.NewTicker(housekeepingInterval)
	defer t.Stop()
	var lastSnap time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.sweepDisconnected()
			if now.Sub(lastSnap) >= time.Second {
				lastSnap = now
				r.expo.snapshot(now)
				r.gpuMeter.sample(now, r.busyNanos.Load())
			}
		}
	}
}

// sweepDisconnected aborts requests whose client has gone away before the
// replica wrote anything to it: fasthttp only notices a disconnect on a
// failed write, and nothing is written while a request is queued or
// prefilling, or for a non-streaming request until it is done. vLLM notices
// through the ASGI disconnect event and aborts; so do we, within
// housekeepingInterval.
func (r *Replica) sweepDisconnected() {
	r.waitMu.Lock()
	var gone []*request
	for q := range r.waiters {
		if q.conn != nil && peerClosed(q.conn) {
			gone = append(gone, q)
		}
	}
	for _, q := range gone {
		delete(r.waiters, q)
	}
	r.waitMu.Unlock()
	for _, q := range gone {
		q.disconnected()
	}
}

func (r *Replica) watch(q *request) {
	r.waitMu.Lock()
	r.waiters[q] = struct{}{}
	r.waitMu.Unlock()
}

func (r *Replica) unwatch(q *request) {
	r.waitMu.Lock()
	delete(r.waiters, q)
	r.waitMu.Unlock()
}
