package admission

import (
	"math"
	"time"
)

// estimateWait is how long a queued request should wait: the cost that
// goes before it (higher classes, shorter or aged requests of its class)
// plus its own, over the pool's drain rate. known is false while the
// drain rate is unknown.
func (c *Controller) estimateWait(e *entry, now time.Time) (time.Duration, bool) {
	if c.drainRate <= 0 {
		return 0, false
	}
	ahead := c.classes[e.class].ahead(e.tokens, now, c.cfg.AgingBound) // includes e itself
	for i := e.class + 1; i < len(c.classes); i++ {
		ahead += c.classes[i].tokens
	}
	return seconds(float64(ahead) / c.drainRate), true
}

// shed counts a refusal and builds its error. RetryAfter is wait for a
// deadline refusal, else the time to drain what is queued at or above the
// class.
func (c *Controller) shed(r Reason, class int, wait time.Duration) error {
	c.m.shed[r].Inc()
	retry := wait
	if retry == 0 && c.drainRate > 0 {
		var ahead int64
		for i := class; i < len(c.classes); i++ {
			ahead += c.classes[i].tokens
		}
		retry = seconds(float64(ahead) / c.drainRate)
	}
	retry = min(max(retry, minRetryAfter), max(c.cfg.MaxRetryAfter, minRetryAfter))
	return &ShedError{Reason: r, RetryAfter: retry, Wait: wait}
}

// account adds busy time since the last call (if the queue was non-empty)
// and released tokens to the drain-rate sample, and folds a full sample
// into the EWMA. Call it, before changing the queue, at every locked
// operation that reads the clock.
func (c *Controller) account(now time.Time, released int64) {
	if c.queued > 0 {
		if d := now.Sub(c.busyMark); d > 0 {
			c.busyTime += d
		}
		c.busyTokens += released
	}
	c.busyMark = now
	if c.busyTime < c.cfg.DrainWindow {
		return
	}
	sample := float64(c.busyTokens) / c.busyTime.Seconds()
	if c.drainRate <= 0 {
		c.drainRate = sample
	} else {
		c.drainRate += c.cfg.DrainAlpha * (sample - c.drainRate)
	}
	c.busyTime, c.busyTokens = 0, 0
	c.m.drainRate.Set(c.drainRate)
}

// seconds converts float seconds to a Duration, saturating.
func seconds(s float64) time.Duration {
	if s >= math.MaxInt64/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}
