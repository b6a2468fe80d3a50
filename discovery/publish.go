package discovery

import (
	"context"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Change kinds, the "change" label of gpurouter_discovery_changes_total.
const (
	ChangeAdded    = "added"    // a new endpoint, ready or not
	ChangeRemoved  = "removed"  // gone from the source: removed as an admin remove does
	ChangeDraining = "draining" // turned terminating or not ready: no new requests
	ChangeReady    = "ready"    // ready again
)

// Metrics are the discovery series. Build with NewMetrics; a nil *Metrics
// records nothing.
type Metrics struct {
	changes *prometheus.CounterVec
	errors  *prometheus.CounterVec
}

// NewMetrics registers the discovery series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_discovery_changes_total",
			Help: "Replica-set changes discovery applied, by pool, source (dns, kubernetes) and change (added, removed, draining, ready).",
		}, []string{"model", "source", "change"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_discovery_errors_total",
			Help: "Failed discovery attempts (a lookup, a list or watch, a refused update), by pool and source.",
		}, []string{"model", "source"}),
	}
	for _, c := range []prometheus.Collector{m.changes, m.errors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) change(model, source, change string) {
	if m != nil {
		m.changes.WithLabelValues(model, source, change).Inc()
	}
}

func (m *Metrics) failed(model, source string) {
	if m != nil {
		m.errors.WithLabelValues(model, source).Inc()
	}
}

// Publisher is what every source shares: it hands a pool's sets to the
// sink when they differ from the last one it accepted, and logs and
// counts each change. Build with NewPublisher. Not safe for concurrent
// use: one per source loop.
type Publisher struct {
	model, source string
	sink          Sink
	metrics       *Metrics
	log           *zap.Logger
	last          []Endpoint // the last set the sink accepted, sorted; nil before the first
	published     bool
	refused       string // the last refusal logged, so a repeated one is not logged again
}

// NewPublisher builds the publisher of source (a metric label: "dns",
// "kubernetes") for the pool serving model; nil m and log mean none.
func NewPublisher(model, source string, sink Sink, m *Metrics, log *zap.Logger) *Publisher {
	if log == nil {
		log = zap.NewNop()
	}
	return &Publisher{model: model, source: source, sink: sink, metrics: m, log: log}
}

// Failed counts a failed discovery attempt (a lookup, a list or watch).
func (p *Publisher) Failed() { p.metrics.failed(p.model, p.source) }

// Publish offers eps (any order; it is sorted in place) to the sink unless
// it equals the last set accepted; a refusal is counted, logged unless it
// repeats the last one, and returned.
func (p *Publisher) Publish(ctx context.Context, eps []Endpoint) error {
	sortEndpoints(eps)
	if p.published && slices.Equal(eps, p.last) {
		return nil
	}
	if err := p.sink.SetEndpoints(ctx, p.model, eps); err != nil {
		p.metrics.failed(p.model, p.source)
		if err.Error() != p.refused {
			p.refused = err.Error()
			p.log.Error("discovery: replica set refused", zap.String("model", p.model), zap.String("source", p.source), zap.Error(err))
		}
		return err
	}
	p.refused = ""
	for _, c := range diff(p.last, eps) {
		p.metrics.change(p.model, p.source, c.kind)
		p.log.Info("discovery: replica "+c.kind, zap.String("model", p.model), zap.String("source", p.source),
			zap.String("replica", c.ep.Name), zap.String("url", c.ep.URL))
	}
	p.last = slices.Clone(eps)
	p.published = true
	return nil
}

// change is one difference between two sets.
type change struct {
	kind string
	ep   Endpoint
}

// diff lists what turns prev into next (both sorted by name). An endpoint
// whose URL, GPU or role changed under the same name is removed and added:
// the fleet builds a new replica for it.
func diff(prev, next []Endpoint) []change {
	var out []change
	i, j := 0, 0
	for i < len(prev) || j < len(next) {
		switch {
		case j == len(next) || (i < len(prev) && prev[i].Name < next[j].Name):
			out = append(out, change{ChangeRemoved, prev[i]})
			i++
		case i == len(prev) || next[j].Name < prev[i].Name:
			out = append(out, change{ChangeAdded, next[j]})
			j++
		default:
			a, b := prev[i], next[j]
			switch {
			case a.URL != b.URL || a.GPU != b.GPU || a.Role != b.Role:
				out = append(out, change{ChangeRemoved, a}, change{ChangeAdded, b})
			case !a.Draining && b.Draining:
				out = append(out, change{ChangeDraining, b})
			case a.Draining && !b.Draining:
				out = append(out, change{ChangeReady, b})
			}
			i++
			j++
		}
	}
	return out
}
