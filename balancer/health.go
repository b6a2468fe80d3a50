package balancer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Prober checks one replica once. It returns nil when the replica is fit to
// serve.
type Prober interface {
	Probe(ctx context.Context, r *Replica) error
}

// HTTPProber probes GET {replica URL}{Path} and expects 200, which is how
// vLLM's /health reports a live engine (503 when the engine is dead).
type HTTPProber struct {
	Client *http.Client // nil means a client with no timeout of its own (the context bounds it)
	Path   string       // default DefaultHealthPath
}

// Probe implements Prober.
func (p HTTPProber) Probe(ctx context.Context, r *Replica) error {
	path := p.Path
	if path == "" {
		path = DefaultHealthPath
	}
	c := p.Client
	if c == nil {
		c = http.DefaultClient
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	// A base URL written with a trailing slash (http://host:8000/) would
	// otherwise probe //health, which vLLM answers 404: the replica would be
	// marked down for good while serving traffic fine.
	target := strings.TrimRight(r.URL(), "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	// Drain a little before closing so the keep-alive connection is reused
	// by the next round instead of a new one being dialled every Interval.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health: %s answered %d", path, resp.StatusCode)
	}
	return nil
}

// Defaults for HealthConfig's zero fields and HTTPProber's empty Path.
const (
	DefaultHealthPath         = "/health"
	DefaultHealthInterval     = 2 * time.Second
	DefaultHealthTimeout      = time.Second
	DefaultUnhealthyThreshold = 2
	DefaultHealthyThreshold   = 1
)

// HealthConfig tunes active health checking. Zero fields take the defaults
// given in brackets.
type HealthConfig struct {
	Interval           time.Duration // between rounds [2s]
	Timeout            time.Duration // per probe [1s]
	UnhealthyThreshold int           // consecutive failures before marking down [2]
	HealthyThreshold   int           // consecutive successes before marking up [1]
	// BusyGrace is how recently a replica must have delivered output for a
	// probe that timed out to count as inconclusive instead of a failure
	// [Interval × UnhealthyThreshold + Timeout]; negative turns it off. A
	// router or engine so busy that /health answers late is not down, and
	// marking the last busy replicas down turns overload into an outage.
	// Refusals (connection refused, non-200) always count.
	BusyGrace time.Duration
	// NewTicker paces Run's rounds: it returns a channel that delivers a
	// tick every d and a function that stops it. Injected so tests drive
	// rounds one tick at a time instead of waiting for Interval; nil means
	// time.NewTicker.
	NewTicker func(d time.Duration) (ticks <-chan time.Time, stop func())
}

func (c HealthConfig) withDefaults() HealthConfig {
	if c.Interval <= 0 {
		c.Interval = DefaultHealthInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultHealthTimeout
	}
	if c.UnhealthyThreshold <= 0 {
		c.UnhealthyThreshold = DefaultUnhealthyThreshold
	}
	if c.HealthyThreshold <= 0 {
		c.HealthyThreshold = DefaultHealthyThreshold
	}
	if c.BusyGrace == 0 {
		c.BusyGrace = c.Interval*time.Duration(c.UnhealthyThreshold) + c.Timeout
	}
	if c.NewTicker == nil {
		c.NewTicker = realTicker
	}
	return c
}

// realTicker is HealthConfig.NewTicker over package time.
func realTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// HealthChecker probes every replica periodically and flips Replica.Healthy
// after the configured number of consecutive results, so one lost probe
// doesn't take a replica out and a flapping one doesn't oscillate per probe.
type HealthChecker struct {
	cfg      HealthConfig
	prober   Prober
	replicas func() []*Replica // the current replica set (it may change on reload)
	log      *zap.Logger

	mu     sync.Mutex // guards streak: touched only by rounds, never by requests
	streak map[*Replica]int
}

// NewHealthChecker builds a checker; Run starts it.
func NewHealthChecker(cfg HealthConfig, prober Prober, replicas func() []*Replica, log *zap.Logger) *HealthChecker {
	if log == nil {
		log = zap.NewNop()
	}
	return &HealthChecker{
		cfg:      cfg.withDefaults(),
		prober:   prober,
		replicas: replicas,
		log:      log,
		streak:   make(map[*Replica]int),
	}
}

// Run probes at once and then on every tick of the config's ticker (every
// Interval) until ctx ends.
func (h *HealthChecker) Run(ctx context.Context) error {
	ticks, stop := h.cfg.NewTicker(h.cfg.Interval)
	defer stop()
	for {
		h.CheckOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticks:
		}
	}
}

// CheckOnce probes every replica concurrently and applies the results. It
// returns when all probes have finished (each bounded by Timeout).
func (h *HealthChecker) CheckOnce(ctx context.Context) {
	rs := h.replicas()
	results := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
			defer cancel()
			results[i] = h.prober.Probe(pctx, r)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // a probe cut short by shutdown says nothing about the replica
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	live := make(map[*Replica]int, len(rs))
	for i, r := range rs {
		// streak > 0 counts successes in a row, < 0 failures in a row.
		s := h.streak[r]
		switch err := results[i]; {
		case err == nil:
			s = max(s, 0) + 1
		case h.busy(r, err):
			// inconclusive: neither a success nor a failure in a row
		default:
			s = min(s, 0) - 1
		}
		live[r] = s
		switch {
		case !r.Healthy() && s >= h.cfg.HealthyThreshold:
			r.SetHealthy(true)
			h.log.Info("replica healthy", zap.String("replica", r.Name()))
		case r.Healthy() && -s >= h.cfg.UnhealthyThreshold:
			r.SetHealthy(false)
			h.log.Warn("replica unhealthy", zap.String("replica", r.Name()), zap.Error(results[i]))
		}
	}
	h.streak = live // drops replicas that left the set
}

// busy reports whether a failed probe only says the replica is slow to
// answer while its traffic shows it alive: the probe timed out and the
// replica delivered output within BusyGrace.
func (h *HealthChecker) busy(r *Replica, err error) bool {
	if h.cfg.BusyGrace < 0 || !timedOut(err) {
		return false
	}
	return r.AliveWithin(h.cfg.BusyGrace)
}

// timedOut reports whether err is a deadline running out (the probe's
// context or a network timeout), as opposed to a refusal or a bad status.
func timedOut(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
