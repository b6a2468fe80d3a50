package gpu

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// kind names a telemetry loop in logs and metrics.
type kind string

const (
	kindEngine kind = "engine"
	kindGPU    kind = "gpu"
)

// ScrapeState is where a target's telemetry loop stands.
type ScrapeState uint32

// The scrape states. Transitions between them are what the poller logs.
const (
	StateUnknown   ScrapeState = iota // nothing scraped yet
	StateOK                           // last scrape succeeded in time
	StateSlow                         // last scrape succeeded but took longer than SlowAfter
	StateFailing                      // last scrape failed (error, bad status, timeout, garbage)
	StateOff                          // the source said ErrGPUOff; the loop no longer asks it
	StateNoMetrics                    // the replica answers without engine metrics we read; asked with backoff
)

func (s ScrapeState) String() string {
	switch s {
	case StateOK:
		return "ok"
	case StateSlow:
		return "slow"
	case StateFailing:
		return "failing"
	case StateOff:
		return "off"
	case StateNoMetrics:
		return "no_metrics"
	}
	return "unknown"
}

// loopState is one loop's bookkeeping. The counters and state are atomics
// so Health and the collector read them while the loop runs; mu serialises
// scrapes of this loop (Run's ticks and PollOnce) and guards the rest.
type loopState struct {
	scrapes, failures, slow atomic.Uint64
	lastOK                  atomic.Int64 // unix nanos of the last successful scrape, 0 = never
	state                   atomic.Uint32

	mu       sync.Mutex
	badSince time.Time // when the current slow/failing run began
	badCount uint64    // scrapes in the current slow/failing run
}

// observe counts one scrape outcome and logs if the state changed.
func (p *Poller) observe(t *target, k kind, ls *loopState, now time.Time, took time.Duration, err error) {
	ls.scrapes.Add(1)
	next := StateOK
	switch {
	case errors.Is(err, ErrGPUOff):
		next = StateOff
	case errors.Is(err, ErrNoEngineMetrics):
		// Not a failure: the replica answered, with nothing we read. The
		// poller's discovery logs it once and spaces the scrapes out.
		next = StateNoMetrics
	case err != nil:
		next = StateFailing
		ls.failures.Add(1)
	case took > p.cfg.SlowAfter:
		next = StateSlow
		ls.slow.Add(1)
	}
	if err == nil {
		ls.lastOK.Store(now.UnixNano())
	}
	prev := ScrapeState(ls.state.Swap(uint32(next)))
	if next == StateSlow || next == StateFailing {
		if prev != StateSlow && prev != StateFailing {
			ls.badSince, ls.badCount = now, 0
		}
		ls.badCount++
	}
	if next == prev {
		return
	}
	log := p.cfg.Log
	switch next {
	case StateFailing:
		log.Warn("telemetry scrape failing", zap.String("replica", t.Name), zap.String("source", string(k)),
			zap.Error(err))
	case StateSlow:
		log.Warn("telemetry scrape slow", zap.String("replica", t.Name), zap.String("source", string(k)),
			zap.Duration("took", took), zap.Duration("slow_after", p.cfg.SlowAfter))
	case StateOff:
		// The source logged why, once per process (NVML); one line per
		// replica would repeat it.
		log.Debug("telemetry off", zap.String("replica", t.Name), zap.String("source", string(k)), zap.Error(err))
	case StateOK:
		if prev == StateSlow || prev == StateFailing {
			log.Info("telemetry scrape recovered", zap.String("replica", t.Name), zap.String("source", string(k)),
				zap.Uint64("bad_scrapes", ls.badCount), zap.Duration("bad_for", now.Sub(ls.badSince)))
		}
	}
}

// LoopHealth is one telemetry loop's counters.
type LoopHealth struct {
	State    ScrapeState
	Scrapes  uint64    // every completed scrape (a scrape cut short by shutdown is not counted)
	Failures uint64    // scrapes that failed (an answer without engine metrics is StateNoMetrics, not a failure)
	Slow     uint64    // scrapes that succeeded after SlowAfter
	LastOK   time.Time // when the last successful scrape completed; zero if never
}

// TargetHealth is a target's two loops.
type TargetHealth struct {
	Name        string
	Engine, GPU LoopHealth
}

// Health returns every target's counters, in NewPoller's order.
func (p *Poller) Health() []TargetHealth {
	out := make([]TargetHealth, len(p.targets))
	for i, t := range p.targets {
		out[i] = TargetHealth{Name: t.Name, Engine: t.engine.health(), GPU: t.gpu.health()}
	}
	return out
}

func (ls *loopState) health() LoopHealth {
	h := LoopHealth{
		State:    ScrapeState(ls.state.Load()),
		Scrapes:  ls.scrapes.Load(),
		Failures: ls.failures.Load(),
		Slow:     ls.slow.Load(),
	}
	if ns := ls.lastOK.Load(); ns != 0 {
		h.LastOK = time.Unix(0, ns)
	}
	return h
}
