package gpu

import "time"

// Clock is the poller's time source, injected so tests and benchmarks drive
// rounds without sleeping. A nil Clock in a config means real time.
type Clock interface {
	Now() time.Time
	// NewTicker returns a ticker with period d, as time.NewTicker does.
	NewTicker(d time.Duration) Ticker
}

// Ticker is the part of *time.Ticker the poller uses.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// realClock is Clock over package time.
type realClock struct{}

func (realClock) Now() time.Time                   { return time.Now() }
func (realClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }
