package main

import (
	"errors"
	"fmt"
	"github.com/gpurouter/gpurouter/gpu"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/fleet"
)

// validate checks a configuration whose defaults are already filled. It
// reports every problem, not just the first, each prefixed by the path of
// the option at fault ("pools[1].replicas[0].url: ..."), so that
// `gpurouter serve --check` can list them all at once.
func validate(cfg fileConfig) error {
	var v validator
	if err := checkListen(cfg.Listen); err != nil {
		v.add("listen", "%v", err)
	}
	v.oneOf("log.level", cfg.Log.Level, knownLogLevels)
	v.oneOf("log.format", cfg.Log.Format, knownLogFormats)

	v.positive("timeouts.connect", cfg.Timeouts.Connect)
	v.positive("timeouts.first_byte", cfg.Timeouts.FirstByte)
	v.positive("timeouts.idle", cfg.Timeouts.Idle)
	v.nonNegative("timeouts.total", cfg.Timeouts.Total)

	if cfg.Limits.MaxBodyBytes < minMaxBodyBytes {
		v.add("limits.max_body_bytes", "must be >= %d, got %d", minMaxBodyBytes, cfg.Limits.MaxBodyBytes)
	}
	if cfg.Limits.MaxHeaderBytes < minMaxHeaderBytes {
		v.add("limits.max_header_bytes", "must be >= %d, got %d", minMaxHeaderBytes, cfg.Limits.MaxHeaderBytes)
	}
	v.positive("limits.read_timeout", cfg.Limits.ReadTimeout)
	v.atLeastOne("limits.max_connections", cfg.Limits.MaxConnections)

	v.atLeastOne("retry.max_attempts", cfg.Retry.MaxAttempts)
	v.positive("retry.backoff_base", cfg.Retry.BackoffBase)
	v.positive("retry.backoff_max", cfg.Retry.BackoffMax)
	if cfg.Retry.BackoffMax < cfg.Retry.BackoffBase {
		v.add("retry.backoff_max", "must be >= retry.backoff_base (%v), got %v", cfg.Retry.BackoffBase, cfg.Retry.BackoffMax)
	}

	v.atLeastOne("upstream.max_conns_per_replica", cfg.Upstream.MaxConnsPerReplica)
	v.positive("upstream.max_idle_conn_time", cfg.Upstream.MaxIdleConnTime)
	if cfg.Upstream.MaxHeaderBytes < minUpstreamHeader {
		v.add("upstream.max_header_bytes", "must be >= %d, got %d", minUpstreamHeader, cfg.Upstream.MaxHeaderBytes)
	}
	if cfg.Upstream.StreamLoops < 0 {
		v.add("upstream.stream_loops", "must be >= 0 (0: one per four of GOMAXPROCS), got %d", cfg.Upstream.StreamLoops)
	}
	if cfg.Upstream.RequestLoops < 0 {
		v.add("upstream.request_loops", "must be >= 0 (0: one per two of GOMAXPROCS), got %d", cfg.Upstream.RequestLoops)
	}

	if !strings.HasPrefix(cfg.Health.Path, "/") {
		v.add("health.path", "must start with /, got %q", cfg.Health.Path)
	}
	v.positive("health.interval", cfg.Health.Interval)
	v.positive("health.timeout", cfg.Health.Timeout)
	v.atLeastOne("health.unhealthy_threshold", cfg.Health.UnhealthyThreshold)
	v.atLeastOne("health.healthy_threshold", cfg.Health.HealthyThreshold)

	v.atLeastOne("breaker.consecutive_failures", cfg.Breaker.ConsecutiveFailures)
	v.positive("breaker.open_timeout", cfg.Breaker.OpenTimeout)
	v.atLeastOne("breaker.half_open_requests", cfg.Breaker.HalfOpenRequests)
	v.rangeF("breaker.max_ejection_percent", cfg.Breaker.MaxEjectionPercent, 0, 100, false)

	v.nonNegative("shutdown.drain_timeout", cfg.Shutdown.DrainTimeout)

	v.positive("telemetry.interval", cfg.Telemetry.Interval)
	v.positive("telemetry.timeout", cfg.Telemetry.Timeout)
	v.positive("telemetry.gpu_interval", cfg.Telemetry.GPUInterval)
	v.positive("telemetry.stale_after", cfg.Telemetry.StaleAfter)
	if cfg.Telemetry.StaleAfter > 0 && cfg.Telemetry.StaleAfter < cfg.Telemetry.Interval {
		v.add("telemetry.stale_after", "must be >= telemetry.interval (%v), got %v: every snapshot would be stale", cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter)
	}
	v.tracing(cfg.Tracing)
	if cfg.Admin.Listen != "" {
		if err := checkListen(cfg.Admin.Listen); err != nil {
			v.add("admin.listen", "%v", err)
		}
		if len(cfg.Admin.Token) < 16 {
			v.add("admin.token", "required with admin.listen, at least 16 characters")
		}
	}
	if err := admissionFrom(cfg.Admission).Validate(); err != nil {
		v.add("admission", "%v", err)
	}
	v.nonNegative("admission.aging_bound", cfg.Admission.AgingBound)
	v.nonNegative("admission.default_timeout", cfg.Admission.DefaultTimeout)
	if cfg.Admission.MaxInFlight < 0 {
		v.add("admission.max_in_flight", "must be >= 0, got %d", cfg.Admission.MaxInFlight)
	}
	v.rangeF("routing.waiting_weight", cfg.Routing.WaitingWeight, 0, 1000, false)
	v.rangeF("routing.kv_threshold", cfg.Routing.KVThreshold, 0, 1, true)
	v.rangeF("routing.kv_penalty", cfg.Routing.KVPenalty, 0, 1e6, false)
	v.rangeF("routing.prefill_weight", cfg.Routing.PrefillWeight, 0, 1000, false)
	v.rangeF("routing.bounded_load_epsilon", cfg.Routing.BoundedLoadEpsilon, 0, 100, false)
	if ne := cfg.Routing.NearEqual; math.IsNaN(ne) || ne < 0 || ne > 1000 {
		v.add("routing.near_equal", "must be in [0, 1000] requests, got %g", ne)
	}

	v.auth(cfg.Auth, cfg.Admission.Classes)
	// The pools' rules are the fleet's, so that an admin edit is refused
	// for what the file would be.
	if err := (fleet.Spec{Pools: specPools(cfg.Pools)}).Validate(); err != nil {
		v.errs = append(v.errs, err)
	}
	v.gpus(cfg.Pools)
	v.discovery(cfg.Pools)
	return errors.Join(v.errs...)
}

// rangeF checks lo < f <= hi (or < hi when open).
func (v *validator) rangeF(path string, f, lo, hi float64, open bool) {
	if math.IsNaN(f) || f <= lo || f > hi || (open && f >= hi) {
		v.add(path, "must be in (%g, %g%s, got %g", lo, hi, map[bool]string{true: ")", false: "]"}[open], f)
	}
}

// validator collects problems; each check adds to it and never stops.
type validator struct {
	errs []error
}

func (v *validator) add(path, format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
}

func (v *validator) positive(path string, d time.Duration) {
	if d <= 0 {
		v.add(path, "must be > 0, got %v", d)
	}
}

func (v *validator) nonNegative(path string, d time.Duration) {
	if d < 0 {
		v.add(path, "must be >= 0, got %v", d)
	}
}

func (v *validator) atLeastOne(path string, n int) {
	if n < 1 {
		v.add(path, "must be >= 1, got %d", n)
	}
}

func (v *validator) oneOf(path, got string, known []string) {
	if !slices.Contains(known, got) {
		v.add(path, "must be one of %s, got %q", strings.Join(known, ", "), got)
	}
}

// gpus checks the replicas' GPU bindings: the part of a pool that is the
// file schema's own (fleet.Spec.Validate checks the rest).
func (v *validator) gpus(pools []poolConfig) {
	for i, p := range pools {
		if _, err := gpu.ParseEngine(p.Engine); err != nil {
			v.add(fmt.Sprintf("pools[%d].engine", i), "%v", err)
		}
		for j, r := range p.Replicas {
			if r.GPU != nil {
				v.gpu(fmt.Sprintf("pools[%d].replicas[%d].gpu", i, j), *r.GPU)
			}
		}
	}
}

// gpu checks that a binding names its GPU in exactly one way: a local
// index, a local UUID, an agent (which needs the UUID) or a DCGM exporter
// (which needs a label or a UUID to pick the GPU among the exporter's).
func (v *validator) gpu(at string, g gpuConfig) {
	switch {
	case g.Index == nil && g.UUID == "" && g.AgentURL == "" && g.DCGMURL == "":
		v.add(at, "set one of index, uuid, agent_url (with uuid) or dcgm_url (with label or uuid)")
	case g.Index != nil && (g.AgentURL != "" || g.DCGMURL != ""):
		v.add(at, "index selects a local GPU and cannot be combined with agent_url or dcgm_url")
	case g.Index != nil && g.UUID != "":
		v.add(at, "set index or uuid for a local GPU, not both")
	case g.AgentURL != "" && g.DCGMURL != "":
		v.add(at, "agent_url and dcgm_url are exclusive")
	}
	if g.Index != nil && *g.Index < 0 {
		v.add(at+".index", "must be >= 0, got %d", *g.Index)
	}
	if g.AgentURL != "" {
		if err := fleet.CheckURL(g.AgentURL); err != nil {
			v.add(at+".agent_url", "%v", err)
		}
		if g.UUID == "" {
			v.add(at+".uuid", "required with agent_url")
		}
	}
	if g.DCGMURL != "" {
		if err := fleet.CheckURL(g.DCGMURL); err != nil {
			v.add(at+".dcgm_url", "%v", err)
		}
		if (g.Label == "") == (g.UUID == "") {
			v.add(at, "dcgm_url needs exactly one of label or uuid to pick the GPU")
		}
	} else if g.Label != "" {
		v.add(at+".label", "only used with dcgm_url")
	}
}
