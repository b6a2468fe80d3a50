package balancer

import "time"

// Defaults for BreakerConfig's zero fields.
const (
	DefaultBreakerFailures    = 5
	DefaultBreakerOpenTimeout = 10 * time.Second
	DefaultHalfOpenRequests   = 1
)

// BreakerConfig tunes every replica's circuit breaker. Zero fields take the
// Default* values: 5 consecutive failures open it for 10 s, then one probe.
type BreakerConfig struct {
	ConsecutiveFailures int           // failures in a row that open the breaker
	OpenTimeout         time.Duration // how long it stays open before a probe
	HalfOpenRequests    int           // probes let through while half-open
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.ConsecutiveFailures <= 0 {
		c.ConsecutiveFailures = DefaultBreakerFailures
	}
	if c.OpenTimeout <= 0 {
		c.OpenTimeout = DefaultBreakerOpenTimeout
	}
	if c.HalfOpenRequests <= 0 {
		c.HalfOpenRequests = DefaultHalfOpenRequests
	}
	return c
}
