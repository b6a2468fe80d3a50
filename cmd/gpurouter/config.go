package main

import "time"

// fileConfig is the YAML schema of `gpurouter serve --config FILE`. It is
// decoded strictly (unknown keys are errors), completed by applyDefaults and
// checked by validate, then translated into each package's own Config by
// the serve wiring. Every field is documented, with its default and unit, in
// configs/gpurouter.example.yaml.
type fileConfig struct {
	Listen   string         `yaml:"listen"`
	Log      logConfig      `yaml:"log"`
	Timeouts timeoutsConfig `yaml:"timeouts"`
	Limits   limitsConfig   `yaml:"limits"`
	Retry    retryConfig    `yaml:"retry"`
	Upstream upstreamConfig `yaml:"upstream"`
	Health   healthConfig   `yaml:"health"`
	Breaker  breakerConfig  `yaml:"breaker"`
	Shutdown shutdownConfig `yaml:"shutdown"`
	Pools    []poolConfig   `yaml:"pools"`
}

type logConfig struct {
	Level  string `yaml:"level"`  // debug|info|warn|error; default info
	Format string `yaml:"format"` // json|console; default json
}

type timeoutsConfig struct {
	Connect   time.Duration `yaml:"connect"`    // TCP connect to a replica; default 2s
	FirstByte time.Duration `yaml:"first_byte"` // request sent → first response byte (engine queue + prefill); default 120s
	Idle      time.Duration `yaml:"idle"`       // max gap between two stream events; default 60s
	Total     time.Duration `yaml:"total"`      // whole request, 0 = unlimited; default 0
}

type limitsConfig struct {
	MaxBodyBytes int `yaml:"max_body_bytes"` // request body limit; default 8388608 (8 MiB)
}

type retryConfig struct {
	MaxAttempts int           `yaml:"max_attempts"` // tries per request incl. the first; default 3
	BackoffBase time.Duration `yaml:"backoff_base"` // first backoff, doubled per retry, full jitter; default 10ms
	BackoffMax  time.Duration `yaml:"backoff_max"`  // backoff cap; default 200ms
}

type upstreamConfig struct {
	MaxConnsPerReplica int           `yaml:"max_conns_per_replica"` // concurrent connections (= streams) per replica; default 1024
	MaxIdleConnTime    time.Duration `yaml:"max_idle_conn_time"`    // keep-alive idle; below uvicorn's 5s; default 4s
}

type healthConfig struct {
	Path               string        `yaml:"path"`                // default /health
	Interval           time.Duration `yaml:"interval"`            // default 2s
	Timeout            time.Duration `yaml:"timeout"`             // default 1s
	UnhealthyThreshold int           `yaml:"unhealthy_threshold"` // consecutive failures before marking down; default 2
	HealthyThreshold   int           `yaml:"healthy_threshold"`   // consecutive successes before marking up; default 1
}

type breakerConfig struct {
	ConsecutiveFailures int           `yaml:"consecutive_failures"` // failures in a row that open the breaker; default 5
	OpenTimeout         time.Duration `yaml:"open_timeout"`         // open → half-open; default 10s
	HalfOpenRequests    int           `yaml:"half_open_requests"`   // probes allowed while half-open; default 1
}

type shutdownConfig struct {
	DrainTimeout time.Duration `yaml:"drain_timeout"` // wait for in-flight streams on SIGTERM; default 30s
}

type poolConfig struct {
	Model      string          `yaml:"model"`       // served model name; required, unique across pools incl. aliases
	Aliases    []string        `yaml:"aliases"`     // other names routed to this pool
	PathPrefix string          `yaml:"path_prefix"` // optional route, e.g. /v1/chat/tinyllama; requests under it need no model field
	Policy     string          `yaml:"policy"`      // round_robin|least_request; default least_request
	Replicas   []replicaConfig `yaml:"replicas"`    // at least one
}

type replicaConfig struct {
	URL    string     `yaml:"url"`    // http://host:port of a vLLM server; required
	Name   string     `yaml:"name"`   // label in metrics/logs; default host:port
	Weight float64    `yaml:"weight"` // relative capacity; default 1
	GPU    *gpuConfig `yaml:"gpu"`    // optional binding for GPU telemetry
}

// gpuConfig binds a replica to its GPU(s). Exactly one of Index, UUID
// (local NVML), AgentURL (+UUID) or DCGMURL (+Label) is expected; the
// telemetry issue gives them behaviour.
type gpuConfig struct {
	Index    *int   `yaml:"index"`
	UUID     string `yaml:"uuid"`
	AgentURL string `yaml:"agent_url"`
	DCGMURL  string `yaml:"dcgm_url"`
	Label    string `yaml:"label"`
}
