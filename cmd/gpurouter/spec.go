package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/fleet"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/proxy"
)

// spec translates the file schema into the fleet's desired state; each
// replica's GPU binding becomes a source built by r.gpus.
func (r *router) spec(cfg fileConfig) (fleet.Spec, error) {
	s := fleet.Spec{
		Pools: specPools(cfg.Pools),
		Breaker: balancer.BreakerConfig{
			ConsecutiveFailures: cfg.Breaker.ConsecutiveFailures,
			OpenTimeout:         cfg.Breaker.OpenTimeout,
			HalfOpenRequests:    cfg.Breaker.HalfOpenRequests,
		},
		Score:              scoreConfig(cfg),
		MaxEjectionPercent: cfg.Breaker.MaxEjectionPercent,
	}
	if !cfg.Admission.Disabled {
		a := admissionFrom(cfg.Admission)
		s.Admission = &a
	}
	if cfg.Telemetry.Disabled {
		return s, nil
	}
	s.Telemetry = &gpu.PollerConfig{
		Interval:    cfg.Telemetry.Interval,
		Timeout:     cfg.Telemetry.Timeout,
		GPUInterval: cfg.Telemetry.GPUInterval,
	}
	for i, pc := range cfg.Pools {
		for j, rc := range pc.Replicas {
			if rc.GPU == nil {
				continue
			}
			src, err := r.gpus.source(*rc.GPU)
			if err != nil {
				return fleet.Spec{}, fmt.Errorf("pools[%d].replicas[%d].gpu: %w", i, j, err)
			}
			s.Pools[i].Replicas[j].GPU = src
		}
	}
	return s, nil
}

// specPools translates the file's pools, without their GPU bindings: what
// validate hands to fleet's rules, and what spec completes.
func specPools(pcs []poolConfig) []fleet.Pool {
	out := make([]fleet.Pool, 0, len(pcs))
	for _, pc := range pcs {
		p := fleet.Pool{
			Model:      pc.Model,
			Aliases:    slices.Clone(pc.Aliases),
			PathPrefix: pc.PathPrefix,
			Policy:     pc.Policy,
			MaxTokens:  pc.MaxTokensLimit,
			Discovered: pc.Discovery != nil,
			Split: fleet.Split{PrefillPolicy: pc.Split.PrefillPolicy, MinPromptTokens: pc.Split.MinPromptTokens,
				PrefillsPerReplica: pc.Split.PrefillsPerReplica},
		}
		// validate reports an unknown name; here it reads as auto.
		p.Engine, _ = gpu.ParseEngine(pc.Engine)
		p.Migration = specMigration(pc.Migration, p.Engine)
		p.Prefix = specPrefix(pc.PrefixCache, pc.KVEvents)
		names, paths := adapterPaths(pc.LoRA.Adapters)
		p.LoRA = fleet.LoRA{LoRAConfig: balancer.LoRAConfig{Adapters: names, Paths: paths,
			Blind: pc.LoRA.Aware != nil && !*pc.LoRA.Aware, LoadOnDemand: pc.LoRA.LoadOnDemand,
			LoadTimeout: pc.LoRA.LoadTimeout, LoadBackoff: pc.LoRA.LoadBackoff}, ModelsInterval: pc.LoRA.ModelsInterval}
		for _, a := range pc.Arms {
			p.Arms = append(p.Arms, balancer.Arm{Name: a.Name, Policy: a.Policy, Share: a.Share})
		}
		for _, rc := range pc.Replicas {
			p.Replicas = append(p.Replicas, fleet.Replica{Name: rc.Name, URL: rc.URL, Weight: rc.Weight, Role: rc.Role})
		}
		out = append(out, p)
	}
	return out
}

// filePools is spec's pools in the file schema, for display: each replica
// keeps the GPU binding a replica of its name had in the file's pool.
func filePools(spec fleet.Spec, file []poolConfig) []poolConfig {
	out := make([]poolConfig, 0, len(spec.Pools))
	for _, p := range spec.Pools {
		var bindings map[string]*gpuConfig
		var disc *discoveryConfig
		if i := slices.IndexFunc(file, func(pc poolConfig) bool { return pc.Model == p.Model }); i >= 0 {
			disc = file[i].Discovery
			bindings = map[string]*gpuConfig{}
			for _, rc := range file[i].Replicas {
				bindings[rc.Name] = rc.GPU
			}
		}
		pc := poolConfig{
			Model:          p.Model,
			Aliases:        slices.Clone(p.Aliases),
			PathPrefix:     p.PathPrefix,
			Policy:         p.Policy,
			MaxTokensLimit: p.MaxTokens,
			Engine:         engineName(p.Engine),
			Migration:      fileMigration(p.Migration),
			LoRA:           fileLoRA(p.LoRA),
			Discovery:      disc,
			Split: splitConfig{PrefillPolicy: p.Split.PrefillPolicy, MinPromptTokens: p.Split.MinPromptTokens,
				PrefillsPerReplica: p.Split.PrefillsPerReplica},
		}
		pc.PrefixCache, pc.KVEvents = filePrefix(p.Prefix)
		for _, a := range p.Arms {
			pc.Arms = append(pc.Arms, armConfig{Name: a.Name, Policy: a.Policy, Share: a.Share})
		}
		for _, r := range p.Replicas {
			if p.Discovered {
				break // discovery's, not the file's: /debug/pools shows them
			}
			pc.Replicas = append(pc.Replicas, replicaConfig{URL: r.URL, Name: r.Name, Weight: r.Weight, GPU: bindings[r.Name], Role: r.Role})
		}
		out = append(out, pc)
	}
	return out
}

// specMigration translates a pool's migration options. Token ids are asked
// of vLLM (0.10.2+ returns them; older versions ignore the key) and of an
// engine not yet detected, never of engines known to be something else.
func specMigration(mc migrationConfig, e gpu.Engine) proxy.Migration {
	m := proxy.Migration{Max: proxy.DefaultMigrationMax, MaxSeqLen: mc.MaxSeqLen, DrainGrace: max(mc.DrainGrace, 0)}
	if mc.Max != nil {
		m.Max = *mc.Max
	}
	m.NoTokenIDs = e != gpu.EngineAuto && e != gpu.EngineVLLM
	return m
}

// fileMigration is specMigration's inverse, for display.
func fileMigration(m proxy.Migration) migrationConfig {
	n := m.Max
	mc := migrationConfig{Max: &n, MaxSeqLen: m.MaxSeqLen, DrainGrace: m.DrainGrace}
	if m.DrainGrace == 0 {
		mc.DrainGrace = -time.Second // never
	}
	return mc
}

// specPrefix translates a pool's prefix index options; "off" is the
// fleet's zero mode.
func specPrefix(pc prefixCacheConfig, kv kvEventsConfig) fleet.PrefixCache {
	c := fleet.PrefixCache{Mode: fleet.PrefixMode(pc.Mode), BlockSize: pc.BlockSize, Tokenizer: pc.Tokenizer,
		KVEvents: fleet.KVEvents{Endpoint: kv.Endpoint, ReplayEndpoint: kv.ReplayEndpoint, Topic: kv.Topic}}
	if pc.Mode == "off" {
		c.Mode = fleet.PrefixOff
	}
	return c
}

// filePrefix is specPrefix's inverse, for display.
func filePrefix(c fleet.PrefixCache) (prefixCacheConfig, kvEventsConfig) {
	pc := prefixCacheConfig{Mode: string(c.Mode), BlockSize: c.BlockSize, Tokenizer: c.Tokenizer}
	if c.Mode == fleet.PrefixOff {
		pc.Mode = "off"
	}
	return pc, kvEventsConfig{Endpoint: c.KVEvents.Endpoint, ReplayEndpoint: c.KVEvents.ReplayEndpoint, Topic: c.KVEvents.Topic}
}

// fileLoRA is the file's spelling of a pool's LoRA options, for display.
func fileLoRA(l fleet.LoRA) loraConfig {
	aware := !l.Blind
	var adapters []string
	for _, a := range l.Adapters {
		if p := l.Paths[a]; p != "" {
			a += "=" + p
		}
		adapters = append(adapters, a)
	}
	return loraConfig{Adapters: adapters, Aware: &aware, ModelsInterval: l.ModelsInterval,
		LoadOnDemand: l.LoadOnDemand, LoadTimeout: l.LoadTimeout, LoadBackoff: l.LoadBackoff}
}

// adapterPaths reads lora.adapters entries, each name or name=path (as
// vLLM's --lora-modules): the names, and the paths given (nil: none).
func adapterPaths(entries []string) (names []string, paths map[string]string) {
	for _, e := range entries {
		name, path, ok := strings.Cut(e, "=")
		names = append(names, name)
		if ok {
			if paths == nil {
				paths = map[string]string{}
			}
			paths[name] = path
		}
	}
	return names, paths
}

// engineName is the file's spelling of a pool's engine.
func engineName(e gpu.Engine) string {
	if e == gpu.EngineAuto {
		return "auto"
	}
	return string(e)
}

// renderConfig is the "config_yaml" of GET /admin/state: the last file
// configuration with the pools as spec (admin edits included) has them,
// secrets redacted.
func (r *router) renderConfig(spec fleet.Spec) (string, error) {
	cfg := r.config()
	cfg.Pools = filePools(spec, cfg.Pools)
	var b bytes.Buffer
	if err := writeConfigYAML(&b, redacted(cfg)); err != nil {
		return "", err
	}
	return b.String(), nil
}

// redacted hides secrets in a configuration that will be shown.
func redacted(cfg fileConfig) fileConfig {
	if cfg.Admin.Token != "" {
		cfg.Admin.Token = "REDACTED"
	}
	cfg.Tracing = cfg.Tracing.redacted()
	return cfg
}
