package proxy

import (
	"time"

	"github.com/gpurouter/gpurouter/proxy/observe"
	"github.com/prometheus/client_golang/prometheus"
)

// What the router keeps of a split request (disagg.go): its TTFT in
// phases, in its record and the gpurouter_pd_* series.

// How a request that was to be split was served (pdRecord.path).
const (
	pdSplit    = "split"    // prefill on one replica, decode on another
	pdFallback = "fallback" // the prefill could not be had: served colocated
)

// pdRecord is a split request's phases, behind exchange.pd: nil for a
// request that was never split.
type pdRecord struct {
	path            string
	prefillReplica  string
	prefillAttempts int
	prefillSent     time.Time // the last prefill attempt sent
	prefillDone     time.Time // its answer read (or its failure)
	remote          bool      // the decode step reads the prompt's KV cache from the prefill replica
}

// remoteKV reports whether the request's replica reads its prompt's KV
// cache from another: its lease then carries no prefill (leasePrompt).
func (pd *pdRecord) remoteKV() bool { return pd != nil && pd.remote }

// leasePrompt is the prompt a replica leased for x computes: none when it
// reads the KV cache of a prefill replica, else the whole prompt.
func (x *exchange) leasePrompt() int {
	if x.pd.remoteKV() {
		return 0
	}
	return x.uncached()
}

// recordInto adds the phases to r: prefill (sent to a prefill replica →
// its answer), handoff (→ the decode request sent: the router's pick, a
// retry) and decode_first (→ the first token: the KV read and the first
// decode step, which the router cannot tell apart; the engine's
// vllm:nixl_xfer_time_seconds has the read alone).
func (pd *pdRecord) recordInto(r *observe.Record, x *exchange) {
	if pd == nil {
		return
	}
	r.PDPath, r.PrefillReplica, r.PrefillAttempts = pd.path, pd.prefillReplica, pd.prefillAttempts
	if pd.path != pdSplit || pd.prefillDone.IsZero() {
		return
	}
	r.PrefillS = pd.prefillDone.Sub(pd.prefillSent).Seconds()
	if !x.sent.Before(pd.prefillDone) {
		r.HandoffS = x.sent.Sub(pd.prefillDone).Seconds()
	}
	if !x.firstTok.IsZero() && x.firstTok.After(x.sent) {
		r.DecodeFirstS = x.firstTok.Sub(x.sent).Seconds()
	}
}

// observe counts the request in the gpurouter_pd_* series once it ends.
func (pd *pdRecord) observe(m *pdMetrics, model string, x *exchange) {
	if pd == nil {
		return
	}
	m.requests.WithLabelValues(model, pd.path).Inc()
	var r observe.Record
	pd.recordInto(&r, x)
	if r.PrefillS > 0 {
		m.phase.WithLabelValues(model, "prefill").Observe(r.PrefillS)
		m.phase.WithLabelValues(model, "handoff").Observe(r.HandoffS)
	}
	if r.DecodeFirstS > 0 {
		m.phase.WithLabelValues(model, "decode_first").Observe(r.DecodeFirstS)
	}
}

// pdMetrics are the split requests' series.
type pdMetrics struct {
	requests *prometheus.CounterVec   // model, path
	phase    *prometheus.HistogramVec // model, phase
	retries  *prometheus.CounterVec   // model, reason
}

func newPDMetrics(reg prometheus.Registerer) (*pdMetrics, error) {
	m := &pdMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_pd_requests_total",
			Help: "Requests the router split between a prefill and a decode replica, by model and path: split (prefilled on one replica, decoded on another), fallback (the prefill could not be had: served colocated).",
		}, []string{"model", "path"}),
		phase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpurouter_pd_phase_seconds",
			Help:    "A split request's TTFT in phases: prefill (the prefill request sent → its answer), handoff (→ the decode request sent), decode_first (→ the first token: the KV read and the first decode step).",
			Buckets: ttftBuckets,
		}, []string{"model", "phase"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_pd_prefill_retries_total",
			Help: "Prefill requests retried on another prefill replica, by reason (connect, timeout, or the status that refused it).",
		}, []string{"model", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.phase, m.retries} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
