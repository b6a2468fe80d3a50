package main

import "github.com/gpurouter/gpurouter/admission"

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
			LongPrefillTime:   a.Saturation.LongPrefillTime,
			MaxLongPrefills:   a.Saturation.MaxLongPrefills,
			ShortLanes:        a.Saturation.ShortLanes,
			MaxPrefillWait:    a.Saturation.MaxPrefillWait,
			MaxITLShare:       a.Saturation.MaxITLShare,
		},
	}
}
