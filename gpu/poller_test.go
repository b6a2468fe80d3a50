package gpu

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"go.uber.org/zap/zapcore"
)

func mustPoller(t *testing.T, cfg PollerConfig, targets ...Target) *Poller {
	t.Helper()
	p, err := NewPoller(cfg, targets)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Snapshots carry the poller's clock: At is when the scrape completed,
// Latency how long it took; counters become per-interval deltas.
func TestPollerPublishesStampedSnapshots(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	sink := newRecordingSink()
	round := 0
	engine := fakeEngine(func(ctx context.Context) (*EngineStats, error) {
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > 300*time.Millisecond {
			t.Errorf("scrape context has no 300ms deadline (%v %v)", dl, ok)
		}
		round++
		clk.Advance(30 * time.Millisecond) // the scrape takes 30 ms
		return &EngineStats{Running: round, Reported: FieldRunning | FieldPrefixCache | FieldPreemptions,
			PrefixCacheQueries: float64(100 * round), PrefixCacheHits: float64(90 * round), PrefixCacheHitRate: 0.9,
			PreemptionsTotal: uint64(5 * round)}, nil
	})
	gpus := fakeGPUSource(func(context.Context) ([]GPUStats, error) {
		clk.Advance(time.Millisecond)
		return []GPUStats{{Index: 0, UUID: "GPU-x", UtilizationPct: 50}}, nil
	})
	// Two pollers, so that the sources never run at once on the shared clock.
	p := mustPoller(t, PollerConfig{Clock: clk, Timeout: 300 * time.Millisecond}, Target{Name: "r0", Engine: engine, Sink: sink})
	pg := mustPoller(t, PollerConfig{Clock: clk}, Target{Name: "r1", GPU: gpus, Sink: sink})
	t0 := clk.Now()
	p.PollOnce(context.Background())
	pg.PollOnce(context.Background())
	clk.Advance(170 * time.Millisecond)
	p.PollOnce(context.Background())
	pg.PollOnce(context.Background())

	es := sink.engines()
	if len(es) != 2 {
		t.Fatalf("%d engine snapshots", len(es))
	}
	if es[0].Latency != 30*time.Millisecond || es[0].Preemptions != 0 || es[0].PrefixCacheHitRate != 0.9 {
		t.Errorf("first: %+v", *es[0])
	}
	if !es[0].At.Equal(t0.Add(30*time.Millisecond)) || es[1].At.Sub(es[0].At) != 201*time.Millisecond {
		t.Errorf("At %v then %v (start %v)", es[0].At, es[1].At, t0)
	}
	if es[1].Running != 2 || es[1].Preemptions != 5 || !near(es[1].PrefixCacheHitRate, 0.9) {
		t.Errorf("second: %+v", *es[1])
	}
	if age := es[1].Age(clk.Now()); age != time.Millisecond { // the GPU read after it took 1 ms
		t.Errorf("age right after the scrapes = %v", age)
	}
	clk.Advance(time.Second)
	if age := es[1].Age(clk.Now()); age != time.Second+time.Millisecond {
		t.Errorf("age a second later = %v", age)
	}
	gs := sink.gpus()
	if len(gs) != 2 || gs[0].GPUs[0].UUID != "GPU-x" || gs[0].Latency != time.Millisecond || gs[0].At.IsZero() {
		t.Errorf("GPU snapshots: %+v", gs)
	}
	h := p.Health()
	if h[0].Engine.Scrapes != 2 || !h[0].Engine.LastOK.Equal(es[1].At) || h[0].Engine.State != StateOK || h[0].GPU.Scrapes != 0 {
		t.Errorf("health: %+v", h[0])
	}
}

// A run of failures (or of slow scrapes) is one line when it starts and
// one when it ends, however many ticks it lasts; every scrape is counted.
func TestPollerCountsAndLogsOncePerStateChange(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	log, logs := observedLogger(zapcore.DebugLevel)
	sink := newRecordingSink()
	type outcome struct {
		took time.Duration
		err  error
	}
	refused := errors.New("dial tcp 10.0.0.5:8000: connect: connection refused")
	script := []outcome{
		{10 * time.Millisecond, nil}, // ok
		{0, refused},                 // failing
		{0, refused},                 //
		{0, fmt.Errorf("GET x: %w 503", ErrHTTPStatus)}, // still failing: no new line
		{10 * time.Millisecond, nil},                    // recovered
		{400 * time.Millisecond, nil},                   // slow
		{300 * time.Millisecond, nil},                   //
		{10 * time.Millisecond, nil},                    // recovered
		{0, context.DeadlineExceeded},                   // failing (timeout)
	}
	i := 0
	engine := fakeEngine(func(context.Context) (*EngineStats, error) {
		o := script[i]
		i++
		clk.Advance(o.took)
		if o.err != nil {
			return nil, o.err
		}
		return &EngineStats{Running: i, Reported: FieldRunning}, nil
	})
	p := mustPoller(t, PollerConfig{Clock: clk, Log: log}, Target{Name: "replica-a", Engine: engine, Sink: sink})
	for range script {
		p.PollOnce(context.Background())
		clk.Advance(DefaultInterval)
	}

	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Level.String()+" "+e.Message)
		if e.ContextMap()["replica"] != "replica-a" || e.ContextMap()["source"] != "engine" {
			t.Errorf("line without replica/source: %v", e.ContextMap())
		}
	}
	want := []string{
		"warn telemetry scrape failing",
		"info telemetry scrape recovered",
		"warn telemetry scrape slow",
		"info telemetry scrape recovered",
		"warn telemetry scrape failing",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("log lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if rec := logs.FilterMessage("telemetry scrape recovered").All()[0].ContextMap(); rec["bad_scrapes"] != uint64(3) {
		t.Errorf("first recovery: %v", rec)
	}
	h := p.Health()[0].Engine
	if h.Scrapes != 9 || h.Failures != 4 || h.Slow != 2 || h.State != StateFailing {
		t.Errorf("health %+v", h)
	}
	es := sink.engines()
	if len(es) != 5 { // ok, ok, slow, slow, ok: slow scrapes are still published
		t.Fatalf("%d snapshots published, want 5", len(es))
	}
	if !h.LastOK.Equal(es[4].At) {
		t.Errorf("LastOK %v, last snapshot %v", h.LastOK, es[4].At)
	}
	// The staleness a consumer sees grows through the failure.
	clk.Advance(time.Second)
	if age := es[4].Age(clk.Now()); age < time.Second {
		t.Errorf("age %v", age)
	}
}

// ErrGPUOff is not a failure: the loop goes quiet and stops asking.
func TestPollerGPUOff(t *testing.T) {
	t.Parallel()
	log, logs := observedLogger(zapcore.InfoLevel)
	calls := 0
	off := fakeGPUSource(func(context.Context) ([]GPUStats, error) {
		calls++
		return nil, fmt.Errorf("%w: libnvidia-ml.so.1 not found", ErrGPUOff)
	})
	sink := newRecordingSink()
	p := mustPoller(t, PollerConfig{Clock: newFakeClock(), Log: log}, Target{Name: "r", GPU: off, Sink: sink})
	for range 3 {
		p.PollOnce(context.Background())
	}
	h := p.Health()[0].GPU
	if calls != 1 || h.State != StateOff || h.Failures != 0 || logs.Len() != 0 || len(sink.gpus()) != 0 {
		t.Errorf("calls %d health %+v logs %v", calls, h, logs.All())
	}
}

func TestPollerSurvivesPanickingSource(t *testing.T) {
	t.Parallel()
	log, logs := observedLogger(zapcore.WarnLevel)
	engine := fakeEngine(func(context.Context) (*EngineStats, error) { panic("boom") })
	nilStats := fakeEngine(func(context.Context) (*EngineStats, error) { return nil, nil })
	p := mustPoller(t, PollerConfig{Clock: newFakeClock(), Log: log},
		Target{Name: "a", Engine: engine, Sink: newRecordingSink()},
		Target{Name: "b", Engine: nilStats, Sink: newRecordingSink()})
	p.PollOnce(context.Background())
	for _, h := range p.Health() {
		if h.Engine.Failures != 1 {
			t.Errorf("%s: %+v", h.Name, h.Engine)
		}
	}
	if logs.FilterMessage("telemetry scrape failing").Len() != 2 {
		t.Errorf("logs %v", logs.All())
	}
}

// Run scrapes at start and on every tick of each loop's own ticker, and on
// cancel returns after the scrape in flight, which is not counted.
func TestPollerRun(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	sink := newRecordingSink()
	inFetch := make(chan struct{})
	block := false
	engine := fakeEngine(func(ctx context.Context) (*EngineStats, error) {
		if block {
			close(inFetch)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return &EngineStats{Reported: FieldRunning}, nil
	})
	gpus := fakeGPUSource(func(context.Context) ([]GPUStats, error) { return []GPUStats{{UUID: "GPU-x"}}, nil })
	p := mustPoller(t, PollerConfig{Clock: clk, Interval: 250 * time.Millisecond, GPUInterval: 2 * time.Second},
		Target{Name: "r", Engine: engine, GPU: gpus, Sink: sink})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	tickers := map[time.Duration]*fakeTicker{}
	for range 2 {
		tk := <-clk.tickers
		tickers[tk.period] = tk
	}
	eng, gpu := tickers[250*time.Millisecond], tickers[2*time.Second]
	if eng == nil || gpu == nil {
		t.Fatalf("ticker periods: %v", tickers)
	}
	waitStores := func(kind string, n int) {
		t.Helper()
		for n > 0 {
			if k := <-sink.stored; k == kind {
				n--
			} else {
				t.Fatalf("unexpected %s store", k)
			}
		}
	}
	// Each loop scrapes once at start.
	if a, b := <-sink.stored, <-sink.stored; a == b {
		t.Fatalf("first stores: %s, %s", a, b)
	}
	for range 2 {
		eng.tick(clk.Now())
		waitStores("engine", 1)
	}
	gpu.tick(clk.Now())
	waitStores("gpu", 1)
	if n, g := len(sink.engines()), len(sink.gpus()); n != 3 || g != 2 {
		t.Fatalf("engine %d gpu %d snapshots, want 3 and 2", n, g)
	}
	// The next round blocks in Fetch until cancel. Writing block here is
	// ordered before the loop reads it by the tick's channel handoff.
	block = true
	eng.tick(clk.Now())
	<-inFetch
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	h := p.Health()[0]
	if h.Engine.Scrapes != 3 || h.Engine.Failures != 0 {
		t.Errorf("a scrape cut short by shutdown was counted: %+v", h.Engine)
	}
	select {
	case <-eng.stopped:
	default:
		t.Error("engine ticker not stopped")
	}
}

func TestNewPollerValidates(t *testing.T) {
	t.Parallel()
	s := newRecordingSink()
	_, err := NewPoller(PollerConfig{}, []Target{{Name: "", Sink: s}, {Name: "a", Sink: s}, {Name: "a", Sink: s}, {Name: "b"}})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"target 0: Name is required", `duplicate name "a"`, `target "b": Sink is required`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	p, err := NewPoller(PollerConfig{}, nil)
	if err != nil || p.cfg.Interval != DefaultInterval || p.cfg.Timeout != DefaultTimeout || p.cfg.SlowAfter != DefaultInterval ||
		p.cfg.GPUInterval != DefaultGPUInterval || p.cfg.GPUTimeout != DefaultGPUTimeout || p.cfg.Clock == nil || p.cfg.Log == nil ||
		p.cfg.NoMetricsRetryMax != DefaultNoMetricsRetryMax {
		t.Errorf("defaults: %+v %v", p.cfg, err)
	}
}

func TestPollerCollector(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	fail := true
	engine := fakeEngine(func(context.Context) (*EngineStats, error) {
		if fail {
			return nil, errors.New("nope")
		}
		return &EngineStats{Reported: FieldRunning}, nil
	})
	p := mustPoller(t, PollerConfig{Clock: clk}, Target{Name: "r0", Engine: engine, Sink: newRecordingSink()})
	p.PollOnce(context.Background())
	fail = false
	p.PollOnce(context.Background())
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		expfmt.MetricFamilyToText(&b, mf)
	}
	byName := parseExposition(t, []byte(b.String()))
	l := map[string]string{"replica": "r0", "source": "engine"}
	for name, want := range map[string]float64{
		"gpurouter_telemetry_scrapes_total":                  2,
		"gpurouter_telemetry_scrape_failures_total":          1,
		"gpurouter_telemetry_slow_scrapes_total":             0,
		"gpurouter_telemetry_last_success_timestamp_seconds": float64(clk.Now().Unix()),
	} {
		if got, ok := seriesValue(byName, name, l); !ok || got != want {
			t.Errorf("%s = %v (%v), want %v", name, got, ok, want)
		}
	}
	if _, ok := byName["gpurouter_telemetry_scrapes_total"]; ok {
		if n := len(byName["gpurouter_telemetry_scrapes_total"].GetMetric()); n != 1 {
			t.Errorf("%d series: a target without GPU source must not export gpu series", n)
		}
	}
}
