package kvevents

import (
	"io"
	"log"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the subscribers' counters, one series per pool and replica.
// Build with NewMetrics; a nil *Metrics counts nothing.
type Metrics struct {
	events, gaps, resyncs, replays, connects, errors *prometheus.CounterVec
}

// NewMetrics registers the counters on reg:
//
//	gpurouter_kv_events_total{pool,replica}            events applied
//	gpurouter_kv_event_gaps_total{pool,replica}        sequence gaps seen
//	gpurouter_kv_event_replays_total{pool,replica}     replay requests
//	gpurouter_kv_event_resyncs_total{pool,replica}     index entries dropped and rebuilt
//	gpurouter_kv_event_connects_total{pool,replica}    connections made
//	gpurouter_kv_event_errors_total{pool,replica,kind} connect, disconnect, decode, late, replay, replay_timeout
//
// The index's size per replica is prefixcache's gauge.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"pool", "replica"}, labels...))
		reg.MustRegister(v)
		return v
	}
	return &Metrics{
		events:   vec("gpurouter_kv_events_total", "KV-cache events applied to the prefix index, by replica."),
		gaps:     vec("gpurouter_kv_event_gaps_total", "Gaps in a replica's KV event sequence numbers."),
		replays:  vec("gpurouter_kv_event_replays_total", "Replay requests sent to a replica's replay socket."),
		resyncs:  vec("gpurouter_kv_event_resyncs_total", "Times a replica's prefix index entries were dropped and rebuilt (events lost, engine restarted)."),
		connects: vec("gpurouter_kv_event_connects_total", "Connections made to a replica's KV event socket."),
		errors:   vec("gpurouter_kv_event_errors_total", "KV event failures, by kind (connect, disconnect, decode, late, replay, replay_timeout).", "kind"),
	}
}

// Forget deletes a replica's series (it left the pool).
func (m *Metrics) Forget(pool, replica string) {
	if m == nil {
		return
	}
	for _, v := range []*prometheus.CounterVec{m.events, m.gaps, m.replays, m.resyncs, m.connects} {
		v.DeleteLabelValues(pool, replica)
	}
	m.errors.DeletePartialMatch(prometheus.Labels{"pool": pool, "replica": replica})
}

// replicaMetrics are one replica's counters, resolved once.
type replicaMetrics struct {
	events, gaps, resyncs, replays, connects prometheus.Counter
	errs                                     *prometheus.CounterVec // nil: not counted
	pool, replica                            string
}

func (m *Metrics) replica(pool, replica string) replicaMetrics {
	if m == nil {
		c := func() prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: "unregistered"}) }
		return replicaMetrics{events: c(), gaps: c(), resyncs: c(), replays: c(), connects: c()}
	}
	return replicaMetrics{
		events: m.events.WithLabelValues(pool, replica), gaps: m.gaps.WithLabelValues(pool, replica),
		resyncs: m.resyncs.WithLabelValues(pool, replica), replays: m.replays.WithLabelValues(pool, replica),
		connects: m.connects.WithLabelValues(pool, replica), errs: m.errors, pool: pool, replica: replica,
	}
}

func (r replicaMetrics) err(kind string) {
	if r.errs != nil {
		r.errs.WithLabelValues(r.pool, r.replica, kind).Inc()
	}
}

// discardLogger silences zmq4's own logging: the subscriber reports what
// matters through zap and its counters.
func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }
