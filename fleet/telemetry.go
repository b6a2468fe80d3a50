package fleet

import (
	"fmt"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/prometheus/client_golang/prometheus"
)

// newPoller binds every replica to its telemetry: its engine's /metrics
// and the GPU source its Spec names. It returns nil when telemetry is off.
// A new poller is built for every state; snapshots live on the replicas,
// so nothing is lost but the scrape-state counters.
func (f *Fleet) newPoller(spec Spec, st *state, replicas [][]*balancer.Replica) (*gpu.Poller, error) {
	routes := st.routes
	if spec.Telemetry == nil {
		return nil, nil
	}
	var targets []gpu.Target
	for i, pc := range spec.Pools {
		for j, rc := range pc.Replicas {
			r := replicas[i][j]
			eng, err := gpu.NewEngineSource(rc.URL, pc.Engine, f.scrape)
			if err != nil {
				return nil, fmt.Errorf("pools[%d].replicas[%d]: %w", i, j, err)
			}
			t := gpu.Target{Name: pc.Model + "/" + r.Name(), Engine: eng, GPU: rc.GPU, Sink: r}
			if ctl := routes[i].Admission; ctl != nil {
				t.Sink = pokeSink{Replica: r, ctl: ctl}
			}
			t.Sink = st.prefixSink(i, r, t.Sink, f.opts.Log)
			targets = append(targets, t)
		}
	}
	cfg := *spec.Telemetry
	cfg.Log = f.opts.Log
	return gpu.NewPoller(cfg, targets)
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

// Collector exposes the current poller's metrics. The poller is replaced
// on every change while a registry keeps this one collector.
func (f *Fleet) Collector() prometheus.Collector { return pollerCollector{f} }

type pollerCollector struct{ f *Fleet }

func (c pollerCollector) Describe(chan<- *prometheus.Desc) {} // unchecked: the set follows the poller

func (c pollerCollector) Collect(ch chan<- prometheus.Metric) {
	if p := c.f.state.Load().poller; p != nil {
		p.Collector().Collect(ch)
	}
}
