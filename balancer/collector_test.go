package balancer_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"

	"github.com/gpurouter/gpurouter/balancer"
)

// The package prometheus/testutil can't be imported here: it needs
// github.com/kylelemons/godebug, which this module doesn't carry. scrape
// does what testutil.GatherAndCompare does before diffing: gather through
// a pedantic registry (which also checks Collect against Describe) and
// render the families in the text exposition format, sorted by name and
// labels, so a test compares against a literal scrape.

// newRegistry registers col in a fresh pedantic registry.
func newRegistry(t *testing.T, col prometheus.Collector) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(col); err != nil {
		t.Fatal(err)
	}
	return reg
}

// scrape renders the named families of reg (all when none are named) and
// the number of series across them.
func scrape(t *testing.T, reg prometheus.Gatherer, names ...string) (string, int) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var b strings.Builder
	n := 0
	for _, mf := range mfs {
		if len(names) > 0 && !slices.Contains(names, mf.GetName()) {
			continue
		}
		n += len(mf.GetMetric())
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatalf("MetricFamilyToText: %v", err)
		}
	}
	return b.String(), n
}

// assertScrape compares the named families of reg with want.
func assertScrape(t *testing.T, reg prometheus.Gatherer, want string, names ...string) {
	t.Helper()
	if got, _ := scrape(t, reg, names...); got != want {
		t.Errorf("scrape of %v:\n%s\nwant:\n%s", names, got, want)
	}
}

const (
	metricInFlight = "gpurouter_replica_in_flight_requests"
	metricHealthy  = "gpurouter_replica_healthy"
	metricBreaker  = "gpurouter_replica_breaker_open"
)

const (
	headInFlight = `# HELP gpurouter_replica_in_flight_requests Requests sent to the replica and not yet finished.
# TYPE gpurouter_replica_in_flight_requests gauge
`
	headHealthy = `# HELP gpurouter_replica_healthy 1 when the replica's active health check passes.
# TYPE gpurouter_replica_healthy gauge
`
	headBreaker = `# HELP gpurouter_replica_breaker_open 1 when the replica's circuit breaker is open or half-open.
# TYPE gpurouter_replica_breaker_open gauge
`
)

func newPool(t *testing.T, model string, rs ...*balancer.Replica) *balancer.Pool {
	t.Helper()
	p, err := balancer.NewPool(balancer.PoolConfig{Model: model}, rs)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCollector(t *testing.T) {
	tests := []struct {
		name   string
		pools  func(t *testing.T, c *fakeClock) []*balancer.Pool
		metric string // the one metric family compared
		want   string // its exposition text, without HELP/TYPE when empty
	}{
		{
			name:   "no pools",
			pools:  func(*testing.T, *fakeClock) []*balancer.Pool { return nil },
			metric: metricInFlight,
		},
		{
			name: "in flight per model and replica",
			pools: func(t *testing.T, c *fakeClock) []*balancer.Pool {
				return []*balancer.Pool{
					newPool(t, "llama", newReplica(t, "a", c, replicaOpts{inFlight: 2}), newReplica(t, "b", c, replicaOpts{})),
					newPool(t, "qwen", newReplica(t, "c", c, replicaOpts{inFlight: 7})),
				}
			},
			metric: metricInFlight,
			want: headInFlight + `gpurouter_replica_in_flight_requests{model="llama",replica="a"} 2
gpurouter_replica_in_flight_requests{model="llama",replica="b"} 0
gpurouter_replica_in_flight_requests{model="qwen",replica="c"} 7
`,
		},
		{
			name: "healthy",
			pools: func(t *testing.T, c *fakeClock) []*balancer.Pool {
				return []*balancer.Pool{
					newPool(t, "llama", newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{down: true})),
				}
			},
			metric: metricHealthy,
			want: headHealthy + `gpurouter_replica_healthy{model="llama",replica="a"} 1
gpurouter_replica_healthy{model="llama",replica="b"} 0
`,
		},
		{
			// An unhealthy replica's breaker is independent of its health.
			name: "breaker",
			pools: func(t *testing.T, c *fakeClock) []*balancer.Pool {
				return []*balancer.Pool{
					newPool(t, "llama", newReplica(t, "a", c, replicaOpts{open: true}), newReplica(t, "b", c, replicaOpts{down: true})),
					newPool(t, "qwen", newReplica(t, "c", c, replicaOpts{inFlight: 1})),
				}
			},
			metric: metricBreaker,
			want: headBreaker + `gpurouter_replica_breaker_open{model="llama",replica="a"} 1
gpurouter_replica_breaker_open{model="llama",replica="b"} 0
gpurouter_replica_breaker_open{model="qwen",replica="c"} 0
`,
		},
		{
			// One replica behind two models gets a series per model.
			name: "replica shared by two pools",
			pools: func(t *testing.T, c *fakeClock) []*balancer.Pool {
				shared := newReplica(t, "s", c, replicaOpts{inFlight: 3})
				return []*balancer.Pool{newPool(t, "llama", shared), newPool(t, "llama-lora", shared)}
			},
			metric: metricInFlight,
			want: headInFlight + `gpurouter_replica_in_flight_requests{model="llama",replica="s"} 3
gpurouter_replica_in_flight_requests{model="llama-lora",replica="s"} 3
`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pools := tc.pools(t, newFakeClock())
			reg := newRegistry(t, balancer.NewCollector(func() []*balancer.Pool { return pools }))
			assertScrape(t, reg, tc.want, tc.metric)
			// Three series per replica per pool, one per gauge.
			want := 0
			for _, p := range pools {
				want += 3 * len(p.Replicas())
			}
			if _, got := scrape(t, reg); got != want {
				t.Errorf("%d series, want %d", got, want)
			}
		})
	}
}

// TestCollectorLive: the collector reads the replicas' atomics at scrape
// time, so a lease ending, a health flip or a replica set change shows at
// the next scrape with nothing mirroring it in between.
func TestCollectorLive(t *testing.T) {
	c := newFakeClock()
	a := newReplica(t, "a", c, replicaOpts{})
	pool := newPool(t, "llama", a)
	reg := newRegistry(t, balancer.NewCollector(func() []*balancer.Pool { return []*balancer.Pool{pool} }))
	l, err := a.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	assertScrape(t, reg, headInFlight+
		`gpurouter_replica_in_flight_requests{model="llama",replica="a"} 1
`, metricInFlight)
	l.Done(nil)
	a.SetHealthy(false)
	b := newReplica(t, "b", c, replicaOpts{})
	pool.SetReplicas([]*balancer.Replica{a, b})
	// Families come out sorted by name, as a registry gathers them.
	assertScrape(t, reg, headHealthy+
		`gpurouter_replica_healthy{model="llama",replica="a"} 0
gpurouter_replica_healthy{model="llama",replica="b"} 1
`+headInFlight+
		`gpurouter_replica_in_flight_requests{model="llama",replica="a"} 0
gpurouter_replica_in_flight_requests{model="llama",replica="b"} 0
`, metricInFlight, metricHealthy)
	openBreaker(t, b)
	assertScrape(t, reg, headBreaker+
		`gpurouter_replica_breaker_open{model="llama",replica="a"} 0
gpurouter_replica_breaker_open{model="llama",replica="b"} 1
`, metricBreaker)
}

// TestCollectorLint holds the metric names and help to Prometheus's
// conventions (base units, no reserved suffixes).
func TestCollectorLint(t *testing.T) {
	c := newFakeClock()
	reg := newRegistry(t, balancer.NewCollector(func() []*balancer.Pool {
		return []*balancer.Pool{newPool(t, "llama", newReplica(t, "a", c, replicaOpts{}))}
	}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
