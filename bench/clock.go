package bench

import (
	"context"
	"time"
)

// Clock is the load generator's source of time. Tests inject their own;
// the zero Config uses the real clock.
type Clock interface {
	// Now returns the current time; readings must be monotonic.
	Now() time.Time
	// Sleep waits for d, or until ctx is done and then returns ctx.Err().
	Sleep(ctx context.Context, d time.Duration) error
}

// realClock is the wall clock with monotonic readings.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
