package balancer

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exposes every replica's live state at scrape time (in-flight,
// health, breaker), read from the atomics rather than mirrored by a ticker.
type Collector struct {
	pools    func() []*Pool
	inFlight *prometheus.Desc
	healthy  *prometheus.Desc
	breaker  *prometheus.Desc
}

// NewCollector builds a collector over the current pools.
func NewCollector(pools func() []*Pool) *Collector {
	labels := []string{"model", "replica"}
	return &Collector{
		pools:    pools,
		inFlight: prometheus.NewDesc("gpurouter_replica_in_flight_requests", "Requests sent to the replica and not yet finished.", labels, nil),
		healthy:  prometheus.NewDesc("gpurouter_replica_healthy", "1 when the replica's active health check passes.", labels, nil),
		breaker:  prometheus.NewDesc("gpurouter_replica_breaker_open", "1 when the replica's circuit breaker is open or half-open.", labels, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inFlight
	ch <- c.healthy
	ch <- c.breaker
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.pools() {
		for _, r := range p.Replicas() {
			ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(r.InFlight()), p.Model(), r.Name())
			ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, b2f(r.Healthy()), p.Model(), r.Name())
			ch <- prometheus.MustNewConstMetric(c.breaker, prometheus.GaugeValue, b2f(r.BreakerState() != "closed"), p.Model(), r.Name())
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
