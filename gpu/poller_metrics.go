package gpu

import "github.com/prometheus/client_golang/prometheus"

// Collector returns a prometheus.Collector over the poller's counters,
// read at scrape time: gpurouter_telemetry_{scrapes,scrape_failures,
// slow_scrapes}_total and gpurouter_telemetry_last_success_timestamp_seconds,
// labelled replica and source ("engine" or "gpu"). Register it once.
func (p *Poller) Collector() prometheus.Collector { return pollerCollector{p: p, d: newPollerDescs()} }

type pollerDescs struct{ scrapes, failures, slow, lastOK *prometheus.Desc }

func newPollerDescs() pollerDescs {
	l := []string{"replica", "source"}
	return pollerDescs{
		scrapes:  prometheus.NewDesc("gpurouter_telemetry_scrapes_total", "Telemetry scrapes completed, successful or not.", l, nil),
		failures: prometheus.NewDesc("gpurouter_telemetry_scrape_failures_total", "Telemetry scrapes that failed (error, bad status, timeout, unparsable body).", l, nil),
		slow:     prometheus.NewDesc("gpurouter_telemetry_slow_scrapes_total", "Telemetry scrapes that succeeded but took longer than the slow threshold.", l, nil),
		lastOK:   prometheus.NewDesc("gpurouter_telemetry_last_success_timestamp_seconds", "Unix time of the last successful telemetry scrape (absent until one).", l, nil),
	}
}

type pollerCollector struct {
	p *Poller
	d pollerDescs
}

func (c pollerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.d.scrapes
	ch <- c.d.failures
	ch <- c.d.slow
	ch <- c.d.lastOK
}

func (c pollerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.p.targets {
		for _, l := range []struct {
			k   kind
			on  bool
			val *loopState
		}{{kindEngine, t.Engine != nil, &t.engine}, {kindGPU, t.GPU != nil, &t.gpu}} {
			if !l.on {
				continue
			}
			h := l.val.health()
			src := string(l.k)
			ch <- prometheus.MustNewConstMetric(c.d.scrapes, prometheus.CounterValue, float64(h.Scrapes), t.Name, src)
			ch <- prometheus.MustNewConstMetric(c.d.failures, prometheus.CounterValue, float64(h.Failures), t.Name, src)
			ch <- prometheus.MustNewConstMetric(c.d.slow, prometheus.CounterValue, float64(h.Slow), t.Name, src)
			if !h.LastOK.IsZero() {
				ch <- prometheus.MustNewConstMetric(c.d.lastOK, prometheus.GaugeValue,
					float64(h.LastOK.UnixNano())/1e9, t.Name, src)
			}
		}
	}
}
