package gpu

import (
	"context"
	"sync"
	"time"
)

// fakeClock is a Clock the test moves by hand. Its tickers' channels are
// unbuffered: a send returns only once the loop has taken the tick, and the
// next send only once the loop is back waiting, so "send a tick" is also
// "wait for the previous round to finish", with no sleeps.
type fakeClock struct {
	mu      sync.Mutex // guards now
	now     time.Time
	tickers chan *fakeTicker // every ticker made, in order
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), tickers: make(chan *fakeTicker, 4096)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *fakeClock) NewTicker(d time.Duration) Ticker {
	t := &fakeTicker{period: d, c: make(chan time.Time), stopped: make(chan struct{})}
	c.tickers <- t
	return t
}

type fakeTicker struct {
	period  time.Duration
	c       chan time.Time
	once    sync.Once
	stopped chan struct{} // closed by Stop
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }
func (t *fakeTicker) Stop()               { t.once.Do(func() { close(t.stopped) }) }

// tick delivers one tick; false if the ticker was stopped first.
func (t *fakeTicker) tick(now time.Time) bool {
	select {
	case t.c <- now:
		return true
	case <-t.stopped:
		return false
	}
}

// fakeEngine is an EngineSource run by a function.
type fakeEngine func(ctx context.Context) (*EngineStats, error)

func (f fakeEngine) Fetch(ctx context.Context) (*EngineStats, error) { return f(ctx) }

// fakeGPUSource is a Source run by a function.
type fakeGPUSource func(ctx context.Context) ([]GPUStats, error)

func (f fakeGPUSource) Fetch(ctx context.Context) ([]GPUStats, error) { return f(ctx) }

// recordingSink keeps every snapshot and signals each store on stored.
type recordingSink struct {
	mu     sync.Mutex // guards engine and gpu
	engine []*EngineStats
	gpu    []*GPUSnapshot
	stored chan string // "engine" or "gpu" per store; nil for none
}

func newRecordingSink() *recordingSink { return &recordingSink{stored: make(chan string, 1024)} }

func (s *recordingSink) StoreEngine(e *EngineStats) {
	s.mu.Lock()
	s.engine = append(s.engine, e)
	s.mu.Unlock()
	if s.stored != nil {
		s.stored <- "engine"
	}
}

func (s *recordingSink) StoreGPU(g *GPUSnapshot) {
	s.mu.Lock()
	s.gpu = append(s.gpu, g)
	s.mu.Unlock()
	if s.stored != nil {
		s.stored <- "gpu"
	}
}

func (s *recordingSink) engines() []*EngineStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*EngineStats(nil), s.engine...)
}

func (s *recordingSink) gpus() []*GPUSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*GPUSnapshot(nil), s.gpu...)
}
