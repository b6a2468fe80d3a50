package admission

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Defaults for Config's zero fields.
const (
	DefaultMaxQueueRequests = 1024
	DefaultMaxQueueTokens   = 4 << 20 // tokens (≈4.2M)
	DefaultAgingBound       = 5 * time.Second
	DefaultClasses          = 4
	DefaultMaxUnplaced      = 1
	DefaultRecheckInterval  = 100 * time.Millisecond
	DefaultDrainWindow      = time.Second
	DefaultDrainAlpha       = 0.3
	DefaultMaxRetryAfter    = 60 * time.Second

	// MaxClasses bounds Config.Classes (each class is a queue and a metric
	// label).
	MaxClasses = 16
	// minRetryAfter is the smallest Retry-After hint: HTTP's unit is a second.
	minRetryAfter = time.Second
)

// Config is one pool's admission policy in plain values. The zero value is
// usable: every zero field means its Default* constant (or "off" where the
// field says so). Build the controller with New, which fills defaults and
// validates.
type Config struct {
	// MaxQueueRequests bounds how many requests may wait (default 1024). A
	// negative value disables the queue: a request that cannot go at once
	// is shed.
	MaxQueueRequests int
	// MaxQueueTokens bounds the queued requests' total cost in tokens
	// (default 4Mi). Negative means no token bound.
	MaxQueueTokens int64
	// AgingBound is how long a request may wait before shortest-first
	// ordering stops applying to it (default 5s). The guarantee: once a
	// request has waited AgingBound, no request of its class that arrived
	// after it is admitted before it (aged requests go oldest-first, ahead
	// of younger ones). So from that moment it is admitted exactly when
	// first-come-first-served would admit it: its wait is at most
	// AgingBound plus its FCFS wait counted from then (higher classes
	// aside). Negative means every request is aged on arrival: plain FCFS
	// within a class.
	AgingBound time.Duration
	// Classes is the number of priority classes (default 4, at most
	// MaxClasses); Cost.Class is clamped to [0, Classes).
	Classes int
	// TenantQueueShare caps each tenant's part of the queue, as a fraction
	// of MaxQueueRequests and of MaxQueueTokens, so one tenant's burst can't
	// fill it. 0 means no cap; otherwise in (0, 1].
	TenantQueueShare float64
	// TenantFairness, when true, shares admissions between tenants within a
	// class by virtual time (start-time fair queueing over tokens admitted)
	// instead of plain shortest-first; each tenant's own requests still go
	// shortest-first. Aging still wins over fairness.
	TenantFairness bool
	// DefaultTimeout is the deadline of a request that has none (no
	// Cost.Deadline, no context deadline), counted from arrival. 0 means
	// none: such a request waits until admitted, shed or canceled.
	DefaultTimeout time.Duration
	// ExpireQueued decides what a deadline means once a request is queued.
	// false (the default): the deadline is judged once, on arrival — a
	// request refused then gets 429 at once, and one let into the queue is
	// served however long it ends up waiting, so no client is ever refused
	// late. true: a request still queued when its deadline passes is shed
	// then (ReasonExpired).
	ExpireQueued bool
	// MaxInFlight caps admitted, unreleased requests in the pool, a
	// router-side backstop for when telemetry says nothing. 0 means no cap.
	MaxInFlight int
	// MaxOutstandingTokens caps the admitted, unreleased requests' total
	// cost; a request is always admitted into an empty pool, however large.
	// 0 means no cap.
	MaxOutstandingTokens int64
	// MaxUnplaced is how many requests admitted from the queue may be
	// waiting to be placed on a replica (Ticket.Placed) before the queue
	// admits more (default 1). Capacity's answer counts a request only once
	// the balancer has it, so admitting several on one answer would
	// overfill the pool. Negative means no limit, for a Capacity that
	// counts admissions itself.
	MaxUnplaced int
	// RecheckInterval is Run's period for re-checking the queue against
	// capacity, the safety net behind Poke and releases (default 100ms).
	RecheckInterval time.Duration
	// DrainWindow is how much busy time (queue non-empty) one drain-rate
	// sample covers (default 1s).
	DrainWindow time.Duration
	// DrainAlpha is the EWMA weight of a new drain-rate sample, in (0, 1]
	// (default 0.3).
	DrainAlpha float64
	// InitialDrainRate is the assumed drain rate, in tokens per second, until
	// one is measured. 0 means unknown: no request is refused for its
	// deadline on an estimate until the pool has been measured.
	InitialDrainRate float64
	// MaxRetryAfter caps the Retry-After hint on refusals (default 60s).
	MaxRetryAfter time.Duration

	// Estimate tunes the model's token estimator.
	Estimate EstimateConfig
	// Saturation holds the per-replica saturation thresholds. The controller
	// does not read them: the balancer applies them in its Capacity answer.
	Saturation SaturationConfig
	// Lanes holds length-based lanes, applied by the balancer.
	Lanes LaneConfig
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.MaxQueueRequests == 0 {
		c.MaxQueueRequests = DefaultMaxQueueRequests
	}
	if c.MaxQueueTokens == 0 {
		c.MaxQueueTokens = DefaultMaxQueueTokens
	}
	if c.AgingBound == 0 {
		c.AgingBound = DefaultAgingBound
	}
	if c.Classes == 0 {
		c.Classes = DefaultClasses
	}
	if c.MaxUnplaced == 0 {
		c.MaxUnplaced = DefaultMaxUnplaced
	}
	if c.RecheckInterval == 0 {
		c.RecheckInterval = DefaultRecheckInterval
	}
	if c.DrainWindow == 0 {
		c.DrainWindow = DefaultDrainWindow
	}
	if c.DrainAlpha == 0 {
		c.DrainAlpha = DefaultDrainAlpha
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = DefaultMaxRetryAfter
	}
	c.Estimate = c.Estimate.WithDefaults()
	c.Saturation = c.Saturation.WithDefaults()
	return c
}

// Validate reports every invalid field at once. Zero fields are valid (they
// mean their defaults).
func (c Config) Validate() error {
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, fmt.Errorf("admission: %s = %v: %s", field, v, want))
	}
	if c.Classes < 0 || c.Classes > MaxClasses {
		bad("Classes", c.Classes, fmt.Sprintf("must be in [1, %d] (0 for the default)", MaxClasses))
	}
	if !(c.TenantQueueShare >= 0 && c.TenantQueueShare <= 1) { // also rejects NaN
		bad("TenantQueueShare", c.TenantQueueShare, "must be in [0, 1]")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"DefaultTimeout", c.DefaultTimeout},
		{"RecheckInterval", c.RecheckInterval},
		{"DrainWindow", c.DrainWindow},
		{"MaxRetryAfter", c.MaxRetryAfter},
	} {
		if d.v < 0 {
			bad(d.name, d.v, "must not be negative")
		}
	}
	if c.MaxInFlight < 0 {
		bad("MaxInFlight", c.MaxInFlight, "must not be negative (0 for no cap)")
	}
	if c.MaxOutstandingTokens < 0 {
		bad("MaxOutstandingTokens", c.MaxOutstandingTokens, "must not be negative (0 for no cap)")
	}
	if !(c.DrainAlpha >= 0 && c.DrainAlpha <= 1) {
		bad("DrainAlpha", c.DrainAlpha, "must be in (0, 1] (0 for the default)")
	}
	if !(c.InitialDrainRate >= 0) || math.IsInf(c.InitialDrainRate, 0) {
		bad("InitialDrainRate", c.InitialDrainRate, "must be a finite number ≥ 0 (tokens/s)")
	}
	errs = append(errs, c.Estimate.Validate(), c.Saturation.Validate(), c.Lanes.Validate())
	return errors.Join(errs...)
}

// clampClass maps a request's class into [0, classes).
func clampClass(class, classes int) int {
	return min(max(class, 0), classes-1)
}
