package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/proxy"
	"github.com/gpurouter/gpurouter/proxy/observe"
	"github.com/gpurouter/gpurouter/sketch"
	"github.com/valyala/fasthttp"
)

// observe.LatencyDoc (GET /debug/latency) and RouterLatency are one JSON
// schema written twice, as observe.Record and RouterRecord are.
func TestRouterLatencySchema(t *testing.T) {
	for _, pair := range [][2]reflect.Type{
		{reflect.TypeFor[observe.LatencyDoc](), reflect.TypeFor[RouterLatency]()},
		{reflect.TypeFor[observe.LatencyPool](), reflect.TypeFor[RouterLatencyPool]()},
		{reflect.TypeFor[observe.LatencyReplica](), reflect.TypeFor[RouterLatencyReplica]()},
		{reflect.TypeFor[observe.LatencySummary](), reflect.TypeFor[RouterLatencySummary]()},
	} {
		for _, d := range schemaDiff(pair[0], pair[1]) {
			t.Error(d)
		}
	}
	var doc observe.LatencyDoc
	n := 0
	fillValue(t, reflect.ValueOf(&doc).Elem(), "LatencyDoc", &n)
	in, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var got RouterLatency
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decode the router's document into RouterLatency: %v\n%s", err, in)
	}
	out, _ := json.Marshal(got)
	if !reflect.DeepEqual(jsonDoc(t, in), jsonDoc(t, out)) {
		t.Errorf("round trip changed the document:\n%s\n%s", in, out)
	}
}

// latencyOf is a RouterLatency of one pool whose replicas' ITL sketches
// hold the given gaps (ms).
func latencyOf(from int64, model string, gaps map[string][]float64) *RouterLatency {
	doc := &RouterLatency{FromUnixNs: from, RelativeAccuracy: sketch.RelativeAccuracy, Windows: 32, WindowS: 30}
	p := RouterLatencyPool{Model: model}
	for name, gs := range gaps {
		s := sketch.New()
		for _, g := range gs {
			s.Record(time.Duration(g * float64(time.Millisecond)))
		}
		p.Replicas = append(p.Replicas, RouterLatencyReplica{Replica: name, ITL: RouterLatencySummary{Sketch: s.Snapshot()}})
	}
	doc.Pools = append(doc.Pools, p)
	return doc
}

func TestRunSketches(t *testing.T) {
	before := latencyOf(100, "m", map[string][]float64{"r0": {50, 50}})
	after := latencyOf(100, "m", map[string][]float64{"r0": {50, 50, 10, 11, 12}, "r1": {20}})
	after.Pools = append(after.Pools, latencyOf(100, "other", map[string][]float64{"x": {999}}).Pools...)

	rs, err := RunSketches(before, after, []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	if rs.ITL.Count != 4 || rs.Accuracy != sketch.RelativeAccuracy {
		t.Fatalf("run sketch %+v, want the 4 gaps recorded after the start", rs.ITL)
	}
	if p50, _ := rs.ITL.Quantile(0.5); p50 < 10900*time.Microsecond || p50 > 11100*time.Microsecond {
		t.Errorf("P50 %v, want 11 ms", p50)
	}
	if all, _ := RunSketches(before, after, nil); all.ITL.Count != 5 {
		t.Errorf("every pool: %d gaps, want 5", all.ITL.Count)
	}

	late := latencyOf(130, "m", map[string][]float64{"r0": {10}})
	if _, err := RunSketches(before, late, nil); !errors.Is(err, ErrSketchRetention) {
		t.Errorf("a recycled start window: %v, want ErrSketchRetention", err)
	}
	shrunk := latencyOf(100, "m", map[string][]float64{"r0": {50}})
	if _, err := RunSketches(before, shrunk, nil); !errors.Is(err, sketch.ErrNotEarlier) {
		t.Errorf("counts that went down: %v, want sketch.ErrNotEarlier", err)
	}
}

func TestPoolModels(t *testing.T) {
	pools := []RouterPool{{Model: "a", Aliases: []string{"alias"}}, {Model: "b"}}
	for model, want := range map[string]string{"a": "a", "alias": "a", "b": "b", "": "a b", "unknown": "a b"} {
		if got := strings.Join(PoolModels(pools, model), " "); got != want {
			t.Errorf("PoolModels(%q) = %q, want %q", model, got, want)
		}
	}
}

// gatedRouter serves a gpurouter over urls on loopback; hide, if set,
// answers 404 for its path, as a router from before that endpoint does.
func gatedRouter(t *testing.T, model string, urls []string, hide string) string {
	t.Helper()
	var reps []*balancer.Replica
	for _, u := range urls {
		r, err := balancer.NewReplica(balancer.ReplicaConfig{URL: u}, balancer.BreakerConfig{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, r)
	}
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: model, Policy: "least_request"}, reps)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(proxy.Options{Routes: []proxy.Route{{Pool: pool}}})
	if err != nil {
		t.Fatal(err)
	}
	h := srv.Handler()
	front := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if hide != "" && string(ctx.Path()) == hide {
			ctx.NotFound()
			return
		}
		h(ctx)
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { front.Serve(ln); close(done) }()   //nolint:errcheck
	t.Cleanup(func() { front.Shutdown(); <-done }) //nolint:errcheck
	return "http://" + ln.Addr().String()
}

// sketchRun runs n streamed requests of tokens chunks 1 ms apart through a
// router (after two warm-ups, before the measured part starts) with an
// Observer.
func sketchRun(t *testing.T, hide string, n, tokens int) (*Result, *ServerReport) {
	t.Helper()
	up := startUpstream(t, func(string) sseScript { return sseScript{tokens: tokens, gap: time.Millisecond} })
	base := gatedRouter(t, "m", []string{up.url}, hide)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obs := &Observer{BaseURL: base, Model: "m", Settle: 100 * time.Millisecond}
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Prompt: "hi", PromptTokens: 1, OutputTokens: tokens}
	}
	res, err := Run(ctx, Config{BaseURL: base, Model: "m", Requests: reqs, NumWarmups: 2, RequestIDPrefix: "sk-",
		OnMeasureStart: func(ctx context.Context) { obs.Before(ctx) }}) //nolint:errcheck
	if err != nil {
		t.Fatal(err)
	}
	return res, obs.After(ctx, res)
}

// Against a router with /debug/latency, the router's ITL and queue rows
// come from its sketches of exactly the run: every gap of the measured
// requests, none of the warm-ups'.
func TestObserverReadsRouterSketches(t *testing.T) {
	const n, tokens = 6, 12
	res, rep := sketchRun(t, "", n, tokens)
	if rep.RouterSketches == nil {
		t.Fatalf("no router sketches: %v", rep.SketchErr)
	}
	gaps := 0
	for _, p := range rep.Match.Pairs {
		gaps += p.Router.ITLCount
	}
	if len(rep.Match.Pairs) != n || gaps != n*(tokens-1) {
		t.Fatalf("matched %d requests with %d gaps", len(rep.Match.Pairs), gaps)
	}
	if got := rep.RouterSketches.ITL.Count; got != uint64(gaps) {
		t.Errorf("the run's ITL sketch counts %d gaps, the router's records %d (warm-ups must be subtracted)", got, gaps)
	}
	if got := rep.RouterSketches.Queue.Count; got != n {
		t.Errorf("queue sketch counts %d, want %d", got, n)
	}
	if rep.RouterHist.sketchOf(RowITL) == nil {
		t.Error("the router column's ITL row has no sketch")
	}
	var buf bytes.Buffer
	sum := Summarize(res, MetricOptions{Percentiles: []float64{50, 99}})
	if err := WriteServerReport(&buf, sum, rep, []float64{50, 99}); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "its sketch of every gap (within 0.5%)") || !strings.Contains(out, "ITL  difference") {
		t.Errorf("report:\n%s", out)
	}
	client, router := sum.ITL.Median, 0.0
	if v, ok := rep.RouterSketches.ITL.Quantile(0.5); ok {
		router = ms(v)
	}
	t.Logf("ITL P50: client %.3f ms, router %.3f ms", client, router)
}

// Against a router without /debug/latency, bench says so and reads ITL
// percentiles from the router's histogram, as before.
func TestObserverFallsBackWithoutLatencyEndpoint(t *testing.T) {
	res, rep := sketchRun(t, "/debug/latency", 3, 5)
	if rep.RouterSketches != nil || !errors.Is(rep.SketchErr, ErrNoLatencyEndpoint) {
		t.Fatalf("sketches %v, err %v: want ErrNoLatencyEndpoint", rep.RouterSketches, rep.SketchErr)
	}
	if len(rep.Match.Pairs) != 3 || rep.RouterHist.Rows[RowITL].Count == 0 {
		t.Fatalf("the fallback lost the records or the histogram: %d pairs, %+v", len(rep.Match.Pairs), rep.RouterHist.Rows[RowITL])
	}
	var buf bytes.Buffer
	if err := WriteServerReport(&buf, Summarize(res, MetricOptions{}), rep, []float64{50}); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "ITL percentiles: its histogram buckets (this router has no /debug/latency)") {
		t.Errorf("report does not say where ITL came from:\n%s", out)
	}
}

// BenchmarkClientRouterITLAgreement measures how far the router's ITL
// percentiles (its sketches, over the run) lie from the client's through a
// loopback gpurouter in front of four simulated replicas (one at half
// speed): issue 19's claim, within 1% or 0.2 ms at P50, P90 and P99. Run
// with -benchtime 1x.
func BenchmarkClientRouterITLAgreement(b *testing.B) {
	est := newEstimator(b)
	f, model := simFleet(b, est, 1, 1, 1, 0.5)
	base := routerFor(b, model, f.URLs())
	ps := []float64{50, 90, 99}
	diffs := make([]float64, len(ps))
	for i := 0; i < b.N; i++ {
		ds := UseCaseDataset(DatasetConfig{NumPrompts: 80}, rand.New(rand.NewPCG(uint64(i), 9)))
		res, rep := observedRun(b, base, model, est, ds, 12)
		if rep.RouterSketches == nil {
			b.Fatalf("no router sketches: %v", rep.SketchErr)
		}
		client := Summarize(res, MetricOptions{Percentiles: ps}).ITL
		for j, p := range ps {
			v, _ := rep.RouterSketches.ITL.Quantile(p / 100)
			diffs[j] = 100 * (ms(v) - client.At(p)) / client.At(p)
		}
	}
	for j, p := range ps {
		b.ReportMetric(diffs[j], "itl-p"+percentileLabel(p)+"-router-vs-client-%")
	}
}
