package main

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"
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

	v.nonNegative("shutdown.drain_timeout", cfg.Shutdown.DrainTimeout)

	v.positive("telemetry.interval", cfg.Telemetry.Interval)
	v.positive("telemetry.timeout", cfg.Telemetry.Timeout)
	v.positive("telemetry.gpu_interval", cfg.Telemetry.GPUInterval)
	v.positive("telemetry.stale_after", cfg.Telemetry.StaleAfter)
	if cfg.Telemetry.StaleAfter > 0 && cfg.Telemetry.StaleAfter < cfg.Telemetry.Interval {
		v.add("telemetry.stale_after", "must be >= telemetry.interval (%v), got %v: every snapshot would be stale", cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter)
	}
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

	v.auth(cfg.Auth, cfg.Admission.Classes)
	v.pools(cfg.Pools)
	return errors.Join(v.errs...)
}

// rangeF checks lo < f <= hi (or < hi when open).
func (v *validator) rangeF(path string, f, lo, hi float64, open bool) {
	if math.IsNaN(f) || f <= lo || f > hi || (open && f >= hi) {
		v.add(path, "must be in (%g, %g%s, got %g", lo, hi, map[bool]string{true: ")", false: "]"}[open], f)
	}
}

// arms checks a pool's A/B experiment.
func (v *validator) arms(at string, arms []armConfig) {
	seen := map[string]bool{}
	for i, a := range arms {
		ap := fmt.Sprintf("%s.arms[%d]", at, i)
		switch {
		case a.Name == "":
			v.add(ap+".name", "required")
		case seen[a.Name]:
			v.add(ap+".name", "%q already names another arm", a.Name)
		}
		seen[a.Name] = true
		if !slices.Contains(knownPolicies, a.Policy) {
			v.add(ap+".policy", "unknown policy %q (known: %s)", a.Policy, strings.Join(knownPolicies, ", "))
		}
		if !(a.Share > 0) || math.IsInf(a.Share, 0) {
			v.add(ap+".share", "must be > 0, got %g", a.Share)
		}
	}
	if len(arms) == 1 {
		v.add(at+".arms", "an experiment needs at least two arms (use policy for one)")
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

// pools checks each pool and what must be unique across pools: model
// names and aliases share one namespace, and path prefixes one another.
func (v *validator) pools(pools []poolConfig) {
	if len(pools) == 0 {
		v.add("pools", "at least one pool is required")
		return
	}
	names := make(map[string]int)    // model or alias → index of the pool it names
	prefixes := make(map[string]int) // path prefix, without trailing /, → pool index
	claim := func(path, name string, pool int) {
		if prev, dup := names[name]; dup {
			v.add(path, "%q already names pools[%d]", name, prev)
			return
		}
		names[name] = pool
	}
	for i, p := range pools {
		at := fmt.Sprintf("pools[%d]", i)
		switch {
		case strings.TrimSpace(p.Model) == "":
			v.add(at+".model", "required")
		case strings.TrimSpace(p.Model) != p.Model:
			v.add(at+".model", "%q has leading or trailing spaces", p.Model)
		default:
			claim(at+".model", p.Model, i)
		}
		for j, a := range p.Aliases {
			if strings.TrimSpace(a) == "" {
				v.add(fmt.Sprintf("%s.aliases[%d]", at, j), "must not be empty")
				continue
			}
			claim(fmt.Sprintf("%s.aliases[%d]", at, j), a, i)
		}
		if p.PathPrefix != "" {
			key := strings.TrimSuffix(p.PathPrefix, "/")
			switch {
			case !strings.HasPrefix(p.PathPrefix, "/v1/") || key == "/v1":
				v.add(at+".path_prefix", "must start with /v1/ and name a route below it, got %q", p.PathPrefix)
			case strings.ContainsAny(p.PathPrefix, "?# \t\r\n"):
				v.add(at+".path_prefix", "must be a plain path without query, fragment or spaces, got %q", p.PathPrefix)
			default:
				if prev, dup := prefixes[key]; dup {
					v.add(at+".path_prefix", "%q already used by pools[%d]", p.PathPrefix, prev)
				} else {
					prefixes[key] = i
				}
			}
		}
		if !slices.Contains(knownPolicies, p.Policy) {
			v.add(at+".policy", "unknown policy %q (known: %s)", p.Policy, strings.Join(knownPolicies, ", "))
		}
		if p.MaxTokensLimit < 0 {
			v.add(at+".max_tokens_limit", "must be >= 0 (0 = no cap), got %d", p.MaxTokensLimit)
		}
		v.arms(at, p.Arms)
		v.replicas(at, p.Replicas)
	}
}

// replicas checks one pool's replicas; URLs and names must be unique in the
// pool since both identify a replica in metrics, logs and the admin API.
func (v *validator) replicas(pool string, rs []replicaConfig) {
	if len(rs) == 0 {
		v.add(pool+".replicas", "at least one replica is required")
		return
	}
	urls := make(map[string]int)
	names := make(map[string]int)
	for j, r := range rs {
		at := fmt.Sprintf("%s.replicas[%d]", pool, j)
		if err := checkHTTPURL(r.URL); err != nil {
			v.add(at+".url", "%v", err)
		} else {
			key := canonicalURL(r.URL)
			if prev, dup := urls[key]; dup {
				v.add(at+".url", "%q duplicates replicas[%d]", r.URL, prev)
			} else {
				urls[key] = j
			}
		}
		if r.Name == "" {
			v.add(at+".name", "required (defaults to the URL's host:port)")
		} else if prev, dup := names[r.Name]; dup {
			v.add(at+".name", "%q already used by replicas[%d]", r.Name, prev)
		} else {
			names[r.Name] = j
		}
		if math.IsNaN(r.Weight) || math.IsInf(r.Weight, 0) || r.Weight <= 0 {
			v.add(at+".weight", "must be a finite number > 0, got %v", r.Weight)
		}
		if r.GPU != nil {
			v.gpu(at+".gpu", *r.GPU)
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
		if err := checkHTTPURL(g.AgentURL); err != nil {
			v.add(at+".agent_url", "%v", err)
		}
		if g.UUID == "" {
			v.add(at+".uuid", "required with agent_url")
		}
	}
	if g.DCGMURL != "" {
		if err := checkHTTPURL(g.DCGMURL); err != nil {
			v.add(at+".dcgm_url", "%v", err)
		}
		if (g.Label == "") == (g.UUID == "") {
			v.add(at, "dcgm_url needs exactly one of label or uuid to pick the GPU")
		}
	} else if g.Label != "" {
		v.add(at+".label", "only used with dcgm_url")
	}
}

// canonicalURL is the form in which two replica URLs are compared: scheme
// and host case-insensitive, trailing slash ignored. checkHTTPURL has
// already accepted u.
func canonicalURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return strings.ToLower(u.Scheme+"://"+u.Host) + strings.TrimSuffix(u.Path, "/")
}
