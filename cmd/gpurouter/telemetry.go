package main

import (
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// newPoller binds every replica to its telemetry: its vLLM /metrics, and
// the GPU source its config names (local NVML by index or UUID, a
// `gpurouter agent`, or a DCGM exporter). It returns nil when telemetry is
// disabled. Local NVML is opened lazily by the first read; on a host
// without the driver it logs once that GPU telemetry is off, and every
// replica keeps its engine telemetry.
func newPoller(cfg fileConfig, pools []*balancer.Pool, replicas [][]*balancer.Replica, adm map[*balancer.Pool]*admission.Controller, log *zap.Logger) (*gpu.Poller, error) {
	if cfg.Telemetry.Disabled {
		return nil, nil
	}
	client := &fasthttp.Client{
		Name:                          "gpurouter-telemetry",
		MaxIdleConnDuration:           4 * time.Second, // below uvicorn's 5 s keep-alive
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		MaxConnsPerHost:               4,
	}
	var local *gpu.NVML
	var targets []gpu.Target
	for i, pc := range cfg.Pools {
		for j, rc := range pc.Replicas {
			r := replicas[i][j]
			eng, err := gpu.NewEngineScraper(rc.URL, client)
			if err != nil {
				return nil, fmt.Errorf("pools[%d].replicas[%d]: %w", i, j, err)
			}
			t := gpu.Target{Name: pc.Model + "/" + r.Name(), Engine: eng, Sink: r}
			if ctl, ok := adm[pools[i]]; ok {
				t.Sink = pokeSink{Replica: r, ctl: ctl}
			}
			if g := rc.GPU; g != nil {
				sel := gpu.Selector{}
				if g.Index != nil {
					sel.Indexes = []int{*g.Index}
				}
				if g.UUID != "" {
					sel.UUIDs = []string{g.UUID}
				}
				switch {
				case g.AgentURL != "":
					t.GPU, err = gpu.NewAgentSource(g.AgentURL, sel, client)
				case g.DCGMURL != "":
					if g.Label != "" {
						sel, err = gpu.ParseSelector(g.Label)
						if err != nil {
							break
						}
					}
					t.GPU, err = gpu.NewDCGMSource(g.DCGMURL, sel, client)
				default:
					if local == nil {
						local = gpu.NewNVML(nvml.New(), log)
					}
					t.GPU = gpu.NewNVMLSource(local, sel)
				}
				if err != nil {
					return nil, fmt.Errorf("pools[%d].replicas[%d].gpu: %w", i, j, err)
				}
			}
			targets = append(targets, t)
		}
	}
	return gpu.NewPoller(gpu.PollerConfig{
		Interval:    cfg.Telemetry.Interval,
		Timeout:     cfg.Telemetry.Timeout,
		GPUInterval: cfg.Telemetry.GPUInterval,
		Log:         log,
	}, targets)
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
	}
}

// arms translates a pool's experiment.
func arms(pc poolConfig) []balancer.Arm {
	var out []balancer.Arm
	for _, a := range pc.Arms {
		out = append(out, balancer.Arm{Name: a.Name, Policy: a.Policy, Share: a.Share})
	}
	return out
}
