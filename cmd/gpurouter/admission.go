package main

import (
	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
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
		ExpireQueued:     a.ExpireQueued,
		MaxInFlight:      a.MaxInFlight,
		Saturation: admission.SaturationConfig{
			MaxWaiting:        a.Saturation.MaxWaiting,
			KVUsageThreshold:  a.Saturation.KVUsageThreshold,
			TokenBudgetRatio:  a.Saturation.TokenBudgetRatio,
			LongPrefillTokens: a.Saturation.LongPrefillTokens,
			MaxLongPrefills:   a.Saturation.MaxLongPrefills,
			ShortLanes:        a.Saturation.ShortLanes,
		},
	}
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
