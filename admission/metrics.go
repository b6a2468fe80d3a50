package admission

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// waitBuckets are vLLM's queue-time boundaries (0.3 s up) with finer ones
// below, since a router-side wait is often well under a second; every vLLM
// boundary is kept, so the two still compare bucket by bucket.
func waitBuckets() []float64 {
	return []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2,
		0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
}

// ratioBuckets resolve estimate/actual ratios around 1 (log-symmetric).
func ratioBuckets() []float64 {
	return []float64{0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1, 1.05, 1.11, 1.25, 1.5, 2, 4}
}

// Metrics are the admission series, registered once per Registerer and
// shared by every pool's Controller (each pool is a "model" label value).
// Build with NewMetrics; a nil *Metrics in Deps means none are exported.
type Metrics struct {
	queueDepth  *prometheus.GaugeVec     // model, class
	queueTokens *prometheus.GaugeVec     // model
	wait        *prometheus.HistogramVec // model
	admitted    *prometheus.CounterVec   // model, path
	shed        *prometheus.CounterVec   // model, reason
	held        *prometheus.CounterVec   // model, reason
	canceled    *prometheus.CounterVec   // model
	estimate    *prometheus.HistogramVec // model, kind
	correction  *prometheus.GaugeVec     // model
	expectedOut *prometheus.GaugeVec     // model
	drainRate   *prometheus.GaugeVec     // model
}

// NewMetrics builds the admission series and registers them with reg (nil:
// build them without registering, as tests and unexported use do).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpurouter_admission_queue_depth",
			Help: "Requests waiting in the pool's admission queue, by priority class.",
		}, []string{"model", "class"}),
		queueTokens: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpurouter_admission_queue_tokens",
			Help: "Total estimated cost (prompt + expected output tokens) of the requests waiting in the pool's queue.",
		}, []string{"model"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpurouter_admission_wait_seconds",
			Help:    "Time from Admit to admission, for every admitted request (0 when admitted at once).",
			Buckets: waitBuckets(),
		}, []string{"model"}),
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_admission_admitted_total",
			Help: "Requests admitted, by path: immediate (the pool had room) or queued (waited at the router).",
		}, []string{"model", "path"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_admission_shed_total",
			Help: "Requests refused by admission, by reason (queue_full, queue_tokens, tenant_share, evicted, deadline, expired).",
		}, []string{"model", "reason"}),
		held: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_admission_held_total",
			Help: "Replicas without room for a request as it was queued, by the rule that refused it (one count per available replica per queued request).",
		}, []string{"model", "reason"}),
		canceled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_admission_canceled_total",
			Help: "Requests whose client went away (context done) while they waited in the queue.",
		}, []string{"model"}),
		estimate: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpurouter_admission_estimate_ratio",
			Help:    "Router estimate over the engine's reported count, per finished request: kind=prompt (corrected prompt tokens) or output (expected output tokens). 1 is exact.",
			Buckets: ratioBuckets(),
		}, []string{"model", "kind"}),
		correction: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpurouter_admission_prompt_correction_ratio",
			Help: "Learned engine prompt tokens per router-estimated token (EWMA), applied to new estimates.",
		}, []string{"model"}),
		expectedOut: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpurouter_admission_expected_output_tokens",
			Help: "Learned expected completion length of a request without max_tokens (running quantile).",
		}, []string{"model"}),
		drainRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpurouter_admission_drain_rate_tokens_per_second",
			Help: "Learned rate at which the pool completes admitted work while requests queue (EWMA), used for wait estimates.",
		}, []string{"model"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.queueDepth, m.queueTokens, m.wait, m.admitted, m.shed, m.held,
			m.canceled, m.estimate, m.correction, m.expectedOut, m.drainRate} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// poolMetrics are one pool's pre-resolved children, so the hot path only
// increments and observes.
type poolMetrics struct {
	depth                     []prometheus.Gauge // by class
	tokens                    prometheus.Gauge
	wait                      prometheus.Observer
	admittedNow, admittedWait prometheus.Counter
	shed                      [numReasons]prometheus.Counter
	held                      [numHolds]prometheus.Counter
	canceled                  prometheus.Counter
	promptErr, outputErr      prometheus.Observer
	correction, expectedOut   prometheus.Gauge
	drainRate                 prometheus.Gauge
}

func (m *Metrics) forPool(model string, classes int) *poolMetrics {
	p := &poolMetrics{
		tokens:       m.queueTokens.WithLabelValues(model),
		wait:         m.wait.WithLabelValues(model),
		admittedNow:  m.admitted.WithLabelValues(model, "immediate"),
		admittedWait: m.admitted.WithLabelValues(model, "queued"),
		canceled:     m.canceled.WithLabelValues(model),
		promptErr:    m.estimate.WithLabelValues(model, "prompt"),
		outputErr:    m.estimate.WithLabelValues(model, "output"),
		correction:   m.correction.WithLabelValues(model),
		expectedOut:  m.expectedOut.WithLabelValues(model),
		drainRate:    m.drainRate.WithLabelValues(model),
	}
	for c := range classes {
		p.depth = append(p.depth, m.queueDepth.WithLabelValues(model, strconv.Itoa(c)))
	}
	for r := range numReasons {
		p.shed[r] = m.shed.WithLabelValues(model, r.String())
	}
	for h := HoldNone + 1; h < numHolds; h++ {
		p.held[h] = m.held.WithLabelValues(model, h.String())
	}
	return p
}

// countHold counts one replica that had no room for a queued request.
func (p *poolMetrics) countHold(h Hold) {
	if h > HoldNone && h < numHolds {
		p.held[h].Inc()
	}
}
