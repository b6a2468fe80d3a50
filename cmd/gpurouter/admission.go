package main

import (
	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/proxy"
	"github.com/prometheus/client_golang/prometheus"
)

// admissionFrom translates the file's admission section.
func admissionFrom(a admissionConfig) admission.Config {
	return admission.Config{
		MaxQueueRequests: a.MaxQueueRequests,
		MaxQueueTokens:   a.MaxQueueTokens,
		AgingBound:       a.AgingBound,
		Classes:          a.Classes,
		TenantQueueShare: a.TenantQueueShare,
		TenantFairness:   a.TenantFairness,
		DefaultTimeout:   a.DefaultTimeout,
		MaxInFlight:      a.MaxInFlight,
		Saturation: admission.SaturationConfig{
			MaxWaiting:        a.Saturation.MaxWaiting,
			KVUsageThreshold:  a.Saturation.KVUsageThreshold,
			TokenBudgetRatio:  a.Saturation.TokenBudgetRatio,
			LongPrefillTokens: a.Saturation.LongPrefillTokens,
			MaxLongPrefills:   a.Saturation.MaxLongPrefills,
		},
	}
}

// newAdmission builds one controller per pool (nil map when disabled).
func newAdmission(cfg fileConfig, pools []*balancer.Pool, reg prometheus.Registerer) (map[*balancer.Pool]proxy.PoolAdmission, error) {
	if cfg.Admission.Disabled {
		return nil, nil
	}
	m, err := admission.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	ac := admissionFrom(cfg.Admission)
	out := make(map[*balancer.Pool]proxy.PoolAdmission, len(pools))
	for _, p := range pools {
		capacity := proxy.NewPoolCapacity(p, ac.Saturation, cfg.Telemetry.StaleAfter, nil)
		ctl, err := admission.New(p.Model(), ac, admission.Deps{Capacity: capacity, Metrics: m})
		if err != nil {
			return nil, err
		}
		out[p] = proxy.PoolAdmission{Controller: ctl, Capacity: capacity}
	}
	return out, nil
}

// pokeSink forwards telemetry to the replica and tells the pool's
// admission controller that capacity may have changed, so a queued request
// goes as soon as a scrape shows room rather than at the next recheck.
type pokeSink struct {
	*balancer.Replica
	ctl *admission.Controller
}

func (s pokeSink) StoreEngine(e *gpu.EngineStats) {
	s.Replica.StoreEngine(e)
	s.ctl.Poke()
}
