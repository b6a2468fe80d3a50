package fleet

import (
	"context"
	"slices"
	"sync"

	"go.uber.org/zap"
)

// runner is a background loop: *admission.Controller, *gpu.Poller,
// *balancer.HealthChecker.
type runner interface {
	Run(ctx context.Context) error
}

// Run runs every background loop of the fleet until ctx ends: health
// checks for its whole life, and the admission controllers and poller of
// the current state, started and stopped as changes replace them. It
// returns once every loop has returned. Only one Run may run at a time.
func (f *Fleet) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer f.running.Store(false)
	var wg sync.WaitGroup
	loops := map[runner]context.CancelFunc{}
	defer func() {
		for _, stop := range loops {
			stop()
		}
		wg.Wait()
	}()
	for {
		want := append(f.state.Load().loops(), f.health)
		for _, l := range want {
			if _, ok := loops[l]; ok {
				continue
			}
			lctx, stop := context.WithCancel(ctx)
			loops[l] = stop
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := l.Run(lctx); err != nil && lctx.Err() == nil {
					f.opts.Log.Error("fleet: background loop ended", zap.Error(err))
				}
			}()
		}
		for l, stop := range loops {
			if !slices.Contains(want, l) {
				stop() // replaced by a change; the wait is at the end
				delete(loops, l)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-f.changed:
		}
	}
}
