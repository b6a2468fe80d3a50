package gpu

import (
	"errors"
	"time"

	"go.uber.org/zap"
)

// DefaultNoMetricsRetryMax is PollerConfig.NoMetricsRetryMax's default.
const DefaultNoMetricsRetryMax = time.Minute

// engineDiscovery is what the poller has learnt of the engine behind one
// target's /metrics: which engine it announced, and whether the replica
// exposes none the router reads, in which case its scrapes are spaced out.
// Guarded by the target's engine loopState.mu. The zero value is "nothing
// scraped yet".
type engineDiscovery struct {
	announced Engine        // engine last logged as found; EngineAuto before the first
	absent    bool          // the last answer held no engine metrics (and that was logged)
	backoff   time.Duration // wait after the last absent answer; 0 while metrics are found
	next      time.Time     // no scrape before this; zero for "scrape every interval"
}

// due reports whether the engine may be scraped at now: always, unless the
// replica exposed no engine metrics and its backoff has not run out.
func (d *engineDiscovery) due(now time.Time) bool { return !now.Before(d.next) }

// discover records a scrape's outcome for the engine's discovery: one log
// line per replica when its engine is first found (again after a change),
// one when it exposes no engine metrics, and then scrapes spaced out,
// doubling from twice the interval up to NoMetricsRetryMax, so that a
// replica without metrics costs a scrape a minute instead of a failure
// every interval, yet is picked up within a minute of enabling them.
// Other failures (refused, timeouts, 5xx, malformed lines) change nothing
// here: they are the ordinary failing state, retried every interval.
func (p *Poller) discover(t *target, now time.Time, s *EngineStats, err error) {
	d := &t.disc
	switch {
	case err == nil && s != nil:
		if s.Engine != d.announced || d.absent {
			if s.Engine != EngineAuto { // a source that names no engine has nothing to announce
				p.cfg.Log.Info("replica exposes engine metrics", zap.String("replica", t.Name),
					zap.Stringer("engine", s.Engine))
			}
			d.announced = s.Engine
		}
		d.absent, d.backoff, d.next = false, 0, time.Time{}
	case errors.Is(err, ErrNoEngineMetrics):
		d.backoff = min(max(2*d.backoff, 2*p.cfg.Interval), p.cfg.NoMetricsRetryMax)
		d.next = now.Add(d.backoff)
		if !d.absent {
			d.absent = true
			p.cfg.Log.Warn("replica exposes no known engine metrics; routing it on the router's own counts",
				zap.String("replica", t.Name), zap.Error(err), zap.Duration("retry_max", p.cfg.NoMetricsRetryMax))
		}
	}
}
