package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/fleet"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/proxy"
	"go.yaml.in/yaml/v3"
)

// knownPolicies lists the pool policy names validate accepts: exactly the
// balancer's pickers, so the two cannot drift. Read-only.
var knownPolicies = balancer.Policies()

// knownLogLevels and knownLogFormats are the accepted log.level and
// log.format values. Read-only.
var (
	knownLogLevels  = []string{"debug", "info", "warn", "error"}
	knownLogFormats = []string{"json", "console"}
)

// The defaults of the options only the command has; every other default
// is the owning package's exported Default* constant, so the two cannot
// drift. configs/gpurouter.example.yaml and the comments in config.go
// document the same values.
const (
	defaultListen       = "0.0.0.0:8080"
	defaultLogLevel     = "info"
	defaultLogFormat    = "json"
	defaultDrainTimeout = 30 * time.Second
	minMaxBodyBytes     = 1024
	minMaxHeaderBytes   = 1024
	minUpstreamHeader   = 256
)

// loadConfigFile reads, strictly decodes, completes and validates the
// configuration file at path. The error lists every problem found.
func loadConfigFile(path string) (fileConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return fileConfig{}, err
	}
	cfg, err := parseConfig(data)
	if err != nil {
		return fileConfig{}, fmt.Errorf("%s: invalid configuration:\n%w", path, err)
	}
	resolveKeysFile(&cfg, path)
	return cfg, nil
}

// parseConfig is loadConfigFile without the file: strict decode, then
// applyDefaults, then validate.
func parseConfig(data []byte) (fileConfig, error) {
	cfg, err := decodeStrict(data)
	if err != nil {
		return fileConfig{}, err
	}
	applyDefaults(&cfg)
	if err := validate(cfg); err != nil {
		return fileConfig{}, err
	}
	return cfg, nil
}

// decodeStrict decodes one YAML document into a fileConfig, rejecting
// unknown keys, a second document and an empty input.
func decodeStrict(data []byte) (fileConfig, error) {
	// First pass into a node tree: syntax errors, emptiness, extra
	// documents, and unknown keys reported by their config path rather
	// than by yaml's Go type names.
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return fileConfig{}, errors.New("empty configuration: at least one pool is required")
		}
		return fileConfig{}, err
	}
	if err := dec.Decode(new(yaml.Node)); !errors.Is(err, io.EOF) {
		return fileConfig{}, errors.New("configuration must be a single YAML document (found a second one after ---)")
	}
	if errs := unknownKeys(&root, reflect.TypeFor[fileConfig](), ""); len(errs) > 0 {
		return fileConfig{}, errors.Join(errs...)
	}

	// Second pass into the schema. KnownFields stays on as the safety net
	// for what the walk skips (keys reached through aliases).
	var cfg fileConfig
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	if err := strict.Decode(&cfg); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return fileConfig{}, err
		}
		errs := make([]error, 0, len(te.Errors))
		for _, msg := range te.Errors {
			if strings.Contains(msg, "time.Duration") {
				msg += ` (durations are strings such as "2s" or "150ms")`
			}
			errs = append(errs, errors.New(msg))
		}
		return fileConfig{}, errors.Join(errs...)
	}
	return cfg, nil
}

// unknownKeys walks n alongside the Go type t and reports every mapping key
// that names no field, with its path and line. Aliases are not followed:
// expanding them here could be exponential, and the strict decode that
// follows checks aliased content with yaml's own alias limits.
func unknownKeys(n *yaml.Node, t reflect.Type, path string) []error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var errs []error
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			errs = append(errs, unknownKeys(c, t, path)...)
		}
	case yaml.SequenceNode:
		if t.Kind() != reflect.Slice {
			return nil // a type error the strict decode reports
		}
		for i, c := range n.Content {
			errs = append(errs, unknownKeys(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
		}
	case yaml.MappingNode:
		if t.Kind() != reflect.Struct {
			return nil
		}
		names, fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Tag == "!!merge" { // "<<: {...}" or "<<: [{...}, ...]" merges into this mapping
				merged := []*yaml.Node{v}
				if v.Kind == yaml.SequenceNode {
					merged = v.Content
				}
				for _, m := range merged {
					errs = append(errs, unknownKeys(m, t, path)...)
				}
				continue
			}
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			ft, ok := fields[k.Value]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: unknown key at line %d (known keys: %s)",
					p, k.Line, strings.Join(names, ", ")))
				continue
			}
			errs = append(errs, unknownKeys(v, ft, p)...)
		}
	}
	return errs
}

// yamlFields returns the YAML key names of struct type t, in field order,
// and the Go type behind each.
func yamlFields(t reflect.Type) ([]string, map[string]reflect.Type) {
	names := make([]string, 0, t.NumField())
	types := make(map[string]reflect.Type, t.NumField())
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name) // yaml's own default
		}
		names = append(names, name)
		types[name] = f.Type
	}
	return names, types
}

// applyDefaults fills every zero-valued option with its documented
// default. Zero therefore always means "default": an option whose
// meaningful value is zero (timeouts.total) defaults to zero.
func applyDefaults(cfg *fileConfig) {
	setString(&cfg.Listen, defaultListen)
	setString(&cfg.Log.Level, defaultLogLevel)
	setString(&cfg.Log.Format, defaultLogFormat)
	setDuration(&cfg.Timeouts.Connect, proxy.DefaultConnectTimeout)
	setDuration(&cfg.Timeouts.FirstByte, proxy.DefaultFirstByteTimeout)
	setDuration(&cfg.Timeouts.Idle, proxy.DefaultIdleTimeout)
	setInt(&cfg.Limits.MaxBodyBytes, proxy.DefaultMaxBodyBytes)
	setInt(&cfg.Limits.MaxHeaderBytes, proxy.DefaultMaxHeaderBytes)
	setDuration(&cfg.Limits.ReadTimeout, proxy.DefaultReadTimeout)
	setInt(&cfg.Limits.MaxConnections, proxy.DefaultMaxConnections)
	setInt(&cfg.Retry.MaxAttempts, proxy.DefaultMaxAttempts)
	setDuration(&cfg.Retry.BackoffBase, proxy.DefaultBackoffBase)
	setDuration(&cfg.Retry.BackoffMax, proxy.DefaultBackoffMax)
	setInt(&cfg.Upstream.MaxConnsPerReplica, proxy.DefaultMaxConnsPerReplica)
	setDuration(&cfg.Upstream.MaxIdleConnTime, proxy.DefaultMaxIdleConnTime)
	setInt(&cfg.Upstream.MaxHeaderBytes, proxy.DefaultMaxUpstreamHeader)
	setString(&cfg.Health.Path, balancer.DefaultHealthPath)
	setDuration(&cfg.Health.Interval, balancer.DefaultHealthInterval)
	setDuration(&cfg.Health.Timeout, balancer.DefaultHealthTimeout)
	setInt(&cfg.Health.UnhealthyThreshold, balancer.DefaultUnhealthyThreshold)
	setInt(&cfg.Health.HealthyThreshold, balancer.DefaultHealthyThreshold)
	setInt(&cfg.Breaker.ConsecutiveFailures, balancer.DefaultBreakerFailures)
	setDuration(&cfg.Breaker.OpenTimeout, balancer.DefaultBreakerOpenTimeout)
	setInt(&cfg.Breaker.HalfOpenRequests, balancer.DefaultHalfOpenRequests)
	setFloat(&cfg.Breaker.MaxEjectionPercent, balancer.DefaultMaxEjectionPercent)
	setDuration(&cfg.Shutdown.DrainTimeout, defaultDrainTimeout)
	setDuration(&cfg.Telemetry.Interval, gpu.DefaultInterval)
	setDuration(&cfg.Telemetry.Timeout, gpu.DefaultTimeout)
	setDuration(&cfg.Telemetry.GPUInterval, gpu.DefaultGPUInterval)
	setDuration(&cfg.Telemetry.StaleAfter, 5*cfg.Telemetry.Interval)
	applyTracingDefaults(&cfg.Tracing)
	setInt(&cfg.Admission.MaxQueueRequests, admission.DefaultMaxQueueRequests)
	if cfg.Admission.MaxQueueTokens == 0 {
		cfg.Admission.MaxQueueTokens = admission.DefaultMaxQueueTokens
	}
	setDuration(&cfg.Admission.AgingBound, admission.DefaultAgingBound)
	setInt(&cfg.Admission.Classes, admission.DefaultClasses)
	setFloat(&cfg.Admission.Saturation.KVUsageThreshold, admission.DefaultKVUsageThreshold)
	setFloat(&cfg.Admission.Saturation.TokenBudgetRatio, admission.DefaultTokenBudgetRatio)
	setDuration(&cfg.Admission.Saturation.LongPrefillTime, admission.DefaultLongPrefillTime)
	setInt(&cfg.Admission.Saturation.MaxLongPrefills, admission.DefaultMaxLongPrefills)
	setInt(&cfg.Admission.Saturation.ShortLanes, admission.DefaultShortLanes)
	setDuration(&cfg.Admission.Saturation.MaxPrefillWait, admission.DefaultMaxPrefillWait)
	setFloat(&cfg.Admission.Saturation.MaxITLShare, admission.DefaultMaxITLShare)
	setFloat(&cfg.Routing.WaitingWeight, balancer.DefaultWaitingWeight)
	setFloat(&cfg.Routing.KVThreshold, balancer.DefaultKVThreshold)
	setFloat(&cfg.Routing.KVPenalty, balancer.DefaultKVPenalty)
	setFloat(&cfg.Routing.PrefillWeight, balancer.DefaultPrefillWeight)
	setFloat(&cfg.Routing.BoundedLoadEpsilon, balancer.DefaultEpsilon)
	if len(cfg.Auth.Keys) == 0 {
		cfg.Auth.Keys = nil // "keys: []" and no keys are the same configuration
	}
	for i := range cfg.Pools {
		p := &cfg.Pools[i]
		setString(&p.Policy, balancer.DefaultPolicy)
		applySplitDefaults(p)
		if len(p.Arms) == 0 {
			p.Arms = nil
		}
		for j := range p.Arms {
			setFloat(&p.Arms[j].Share, 1)
		}
		setString(&p.Engine, "auto")
		if p.Migration.Max == nil {
			n := proxy.DefaultMigrationMax
			p.Migration.Max = &n
		}
		setInt(&p.Migration.MaxSeqLen, proxy.DefaultMigrationMaxSeqLen)
		setDuration(&p.Migration.DrainGrace, proxy.DefaultDrainGrace)
		setString(&p.PrefixCache.Mode, string(fleet.PrefixApproximate))
		setString(&p.PrefixCache.Tokenizer, fleet.DefaultPrefixTokenizer)
		if p.LoRA.Aware == nil {
			aware := true
			p.LoRA.Aware = &aware
		}
		setDuration(&p.LoRA.ModelsInterval, fleet.DefaultModelsInterval)
		setDuration(&p.LoRA.LoadTimeout, balancer.DefaultLoRALoadTimeout)
		setDuration(&p.LoRA.LoadBackoff, balancer.DefaultLoRALoadBackoff)
		if len(p.LoRA.Adapters) == 0 {
			p.LoRA.Adapters = nil
		}
		applyDiscoveryDefaults(p)
		// "aliases: []" and no aliases are the same configuration; one
		// spelling keeps printed-then-reloaded configs equal.
		if len(p.Aliases) == 0 {
			p.Aliases = nil
		}
		for j := range p.Replicas {
			r := &p.Replicas[j]
			if r.Weight == 0 {
				r.Weight = balancer.DefaultWeight
			}
			if r.Name == "" {
				// An unparsable URL keeps the name empty; validate
				// reports the URL itself.
				if u, err := url.Parse(r.URL); err == nil {
					r.Name = u.Host
				}
			}
		}
	}
}

func setString(s *string, def string) {
	if *s == "" {
		*s = def
	}
}

func setInt(n *int, def int) {
	if *n == 0 {
		*n = def
	}
}

func setFloat(f *float64, def float64) {
	if *f == 0 {
		*f = def
	}
}

func setDuration(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

// configFromFlags builds the configuration of the flag-only quick start:
// each pool is "MODEL=URL[,URL...]" from a repeatable --pool flag, and
// policy (if not empty) applies to every pool. Errors name the flag value
// at fault; everything else is validated as a file would be.
func configFromFlags(listen string, pools []string, policy string) (fileConfig, error) {
	var errs []error
	if len(pools) == 0 {
		errs = append(errs, errors.New("at least one --pool MODEL=URL[,URL...] is required"))
	}
	if policy != "" && !slices.Contains(knownPolicies, policy) {
		errs = append(errs, fmt.Errorf("--policy %q: unknown policy (known: %s)", policy, strings.Join(knownPolicies, ", ")))
	}
	cfg := fileConfig{Listen: listen}
	seen := make(map[string]string) // model → the --pool value that named it
	for _, spec := range pools {
		model, list, ok := strings.Cut(spec, "=")
		model = strings.TrimSpace(model)
		if !ok {
			errs = append(errs, fmt.Errorf("--pool %q: want MODEL=URL[,URL...]", spec))
			continue
		}
		if model == "" {
			errs = append(errs, fmt.Errorf("--pool %q: empty MODEL (want MODEL=URL[,URL...])", spec))
			continue
		}
		if prev, dup := seen[model]; dup {
			errs = append(errs, fmt.Errorf("--pool %q: model %q already given by --pool %q", spec, model, prev))
			continue
		}
		seen[model] = spec
		if strings.HasPrefix(strings.TrimSpace(list), "dns://") {
			pool, err := dnsPool(model, strings.TrimSpace(list))
			if err != nil {
				errs = append(errs, fmt.Errorf("--pool %q: %w", spec, err))
				continue
			}
			pool.Policy = policy
			cfg.Pools = append(cfg.Pools, pool)
			continue
		}
		pool := poolConfig{Model: model, Policy: policy}
		for i, raw := range strings.Split(list, ",") {
			raw = strings.TrimSpace(raw)
			if err := fleet.CheckURL(raw); err != nil {
				errs = append(errs, fmt.Errorf("--pool %q: URL %d %q: %w", spec, i+1, raw, err))
				continue
			}
			pool.Replicas = append(pool.Replicas, replicaConfig{URL: raw})
		}
		cfg.Pools = append(cfg.Pools, pool)
	}
	if len(errs) > 0 {
		return fileConfig{}, errors.Join(errs...)
	}
	applyDefaults(&cfg)
	if err := validate(cfg); err != nil {
		return fileConfig{}, err
	}
	return cfg, nil
}

// writeConfigYAML prints cfg as YAML, every option included, in a form
// parseConfig reads back to an equal configuration. yaml/v3 already writes
// time.Duration as its String form ("2s") and reads that form back, so the
// schema types are encoded as they are.
func writeConfigYAML(w io.Writer, cfg fileConfig) error {
	if _, err := io.WriteString(w, "# gpurouter effective configuration (defaults filled); see configs/gpurouter.example.yaml\n"); err != nil {
		return err
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(cfg); err != nil {
		return err
	}
	return enc.Close()
}

// checkListen reports why addr cannot be a listen address.
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("must be HOST:PORT: %v", err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > math.MaxUint16 {
		return fmt.Errorf("port %q must be a number from 0 to 65535", port)
	}
	return nil
}
