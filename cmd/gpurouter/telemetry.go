package main

import (
	"sync"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// gpuSources turns the file's GPU bindings into telemetry sources: local
// NVML by index or UUID, a `gpurouter agent`, or a DCGM exporter. One
// client and one local NVML handle serve every source it builds, across
// reloads. NVML is opened lazily by the first read; on a host without the
// driver it logs once that GPU telemetry is off, and every replica keeps
// its engine telemetry.
type gpuSources struct {
	client *fasthttp.Client
	log    *zap.Logger

	once  sync.Once
	local *gpu.NVML // set by once
}

func newGPUSources(log *zap.Logger) *gpuSources {
	return &gpuSources{log: log, client: &fasthttp.Client{
		Name:                          "gpurouter-telemetry",
		MaxIdleConnDuration:           4 * time.Second, // below uvicorn's 5 s keep-alive
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		MaxConnsPerHost:               4,
	}}
}

// source builds the source g names (validated).
func (s *gpuSources) source(g gpuConfig) (gpu.Source, error) {
	sel := gpu.Selector{}
	if g.Index != nil {
		sel.Indexes = []int{*g.Index}
	}
	if g.UUID != "" {
		sel.UUIDs = []string{g.UUID}
	}
	switch {
	case g.AgentURL != "":
		return gpu.NewAgentSource(g.AgentURL, sel, s.client)
	case g.DCGMURL != "":
		if g.Label != "" {
			var err error
			if sel, err = gpu.ParseSelector(g.Label); err != nil {
				return nil, err
			}
		}
		return gpu.NewDCGMSource(g.DCGMURL, sel, s.client)
	default:
		s.once.Do(func() { s.local = gpu.NewLocalNVML(s.log) })
		return gpu.NewNVMLSource(s.local, sel), nil
	}
}

// scoreConfig translates the routing and staleness options.
func scoreConfig(cfg fileConfig) balancer.ScoreConfig {
	return balancer.ScoreConfig{
		StaleAfter:    cfg.Telemetry.StaleAfter,
		FailOpen:      cfg.Telemetry.FailOpen,
		WaitingWeight: cfg.Routing.WaitingWeight,
		KVThreshold:   cfg.Routing.KVThreshold,
		KVPenalty:     cfg.Routing.KVPenalty,
		PrefillWeight: cfg.Routing.PrefillWeight,
		Epsilon:       cfg.Routing.BoundedLoadEpsilon,
		NearEqual:     cfg.Routing.NearEqual,
	}
}
