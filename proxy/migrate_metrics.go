package proxy

import "github.com/prometheus/client_golang/prometheus"

// migrationMetrics count streams whose replica failed under them, and the
// pause their clients saw when they moved.
type migrationMetrics struct {
	results *prometheus.CounterVec   // model, replica, result
	stall   *prometheus.HistogramVec // model
}

func newMigrationMetrics(reg prometheus.Registerer) (*migrationMetrics, error) {
	m := &migrationMetrics{
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_migrations_total",
			Help: "Streams whose replica failed (or was drained past its grace period) after their first byte, by model, that replica, and result: continued (on another replica), failed (no replica took the continuation), abandoned (the client left, the router stopped or the total deadline passed while it moved), not_continuable (migration off for the request, its limit reached, or what it streamed can't be continued: a tool call, reasoning, too long).",
		}, []string{"model", "replica", "result"}),
		stall: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpurouter_migration_stall_seconds",
			Help:    "Pause a client's stream saw when it moved to another replica: its last token from the failed replica to its first from the new one.",
			Buckets: ttftBuckets,
		}, []string{"model"}),
	}
	for _, c := range []prometheus.Collector{m.results, m.stall} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *migrationMetrics) result(model, replica, result string) {
	m.results.WithLabelValues(model, replica, result).Inc()
}
