package gpu

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
)

// fakeReplica serves /metrics from a body the test swaps, and counts the
// scrapes it answers. A nil body is a 404 (metrics not enabled).
type fakeReplica struct {
	srv     *httptest.Server
	body    atomic.Pointer[[]byte]
	scrapes atomic.Int64
}

func newFakeReplica(t *testing.T, body []byte) *fakeReplica {
	t.Helper()
	r := &fakeReplica{}
	r.serve(body)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.scrapes.Add(1)
		if b := r.body.Load(); b != nil && *b != nil {
			w.Write(*b)
			return
		}
		http.NotFound(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *fakeReplica) serve(body []byte) { r.body.Store(&body) }

// An engine the router does not know (here TensorRT-LLM's Triton names)
// costs one log line and a scrape a minute at most, not a failure every
// interval; when the replica starts exposing known metrics, the next
// backed-off scrape picks them up, with one line saying what was found.
// Time is the poller's fake clock: 10 simulated minutes in 3,000 rounds.
func TestPollerBacksOffReplicaWithoutEngineMetrics(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	log, logs := observedLogger(zapcore.DebugLevel)
	replica := newFakeReplica(t, []byte("# TYPE nv_inference_pending_request_count gauge\n"+
		"nv_inference_pending_request_count{model=\"ensemble\",version=\"1\"} 3\n"))
	src, err := NewEngineSource(replica.srv.URL, EngineAuto, nil)
	if err != nil {
		t.Fatal(err)
	}
	sink := newRecordingSink()
	p := mustPoller(t, PollerConfig{Clock: clk, Log: log, Timeout: 5 * time.Second},
		Target{Name: "pool/r0", Engine: src, Sink: sink})
	round := func() {
		p.PollOnce(context.Background())
		clk.Advance(DefaultInterval)
	}
	for range 3000 {
		round()
	}
	// Scrapes at 0, 0.4, 1.2, 2.8, 6, 12.4, 25.2, 50.8 s (waits doubling from
	// two intervals), then every 60 s: 102, 162, …, 582 s. Seventeen.
	h := p.Health()[0].Engine
	if n := replica.scrapes.Load(); n != 17 || h.Scrapes != 17 {
		t.Errorf("%d scrapes answered, %d counted in 10 minutes; want 17", n, h.Scrapes)
	}
	if h.Failures != 0 || h.State != StateNoMetrics || !h.LastOK.IsZero() || len(sink.engines()) != 0 {
		t.Errorf("health %+v, %d snapshots", h, len(sink.engines()))
	}
	if all := logs.All(); len(all) != 1 || all[0].Level != zapcore.WarnLevel ||
		all[0].Message != "replica exposes no known engine metrics; routing it on the router's own counts" ||
		all[0].ContextMap()["replica"] != "pool/r0" {
		t.Fatalf("logs %v, want one warning", all)
	}

	// The engine restarts with metrics: picked up at the next backed-off
	// scrape (642 s), within a minute.
	replica.serve(readTestdata(t, "vllm_v1.txt"))
	rounds := 0
	for len(sink.engines()) == 0 {
		if rounds++; rounds > int(DefaultNoMetricsRetryMax/DefaultInterval) {
			t.Fatalf("not picked up after %d rounds", rounds)
		}
		round()
	}
	if rounds != 211 { // 600.0 s → 642.0 s
		t.Errorf("picked up after %d rounds, want 211", rounds)
	}
	found := logs.FilterMessage("replica exposes engine metrics").All()
	if len(found) != 1 || found[0].ContextMap()["engine"] != "vllm" || found[0].ContextMap()["replica"] != "pool/r0" {
		t.Fatalf("logs %v", logs.All())
	}
	// From then on, a scrape every interval and no more lines.
	before := replica.scrapes.Load()
	for range 50 {
		round()
	}
	if n := replica.scrapes.Load() - before; n != 50 || len(sink.engines()) != 51 || logs.Len() != 2 {
		t.Errorf("%d scrapes, %d snapshots, %d log lines", n, len(sink.engines()), logs.Len())
	}
	if h := p.Health()[0].Engine; h.State != StateOK || h.Failures != 0 {
		t.Errorf("health %+v", h)
	}

	// Metrics switched off again (404): one more warning, backoff again.
	replica.serve(nil)
	before = replica.scrapes.Load()
	for range 300 {
		round()
	}
	if n := replica.scrapes.Load() - before; n > 10 || logs.Len() != 3 ||
		logs.All()[2].Message != "replica exposes no known engine metrics; routing it on the router's own counts" {
		t.Errorf("%d scrapes in a minute; logs %v", n, logs.All())
	}
}

// A known engine is announced once per replica, however many scrapes; a
// failure in between (replica down) does not announce it again.
func TestPollerAnnouncesEngineOnce(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	log, logs := observedLogger(zapcore.InfoLevel)
	replica := newFakeReplica(t, readTestdata(t, "sglang.txt"))
	src, err := NewEngineSource(replica.srv.URL, EngineAuto, nil)
	if err != nil {
		t.Fatal(err)
	}
	sink := newRecordingSink()
	p := mustPoller(t, PollerConfig{Clock: clk, Log: log, Timeout: 5 * time.Second},
		Target{Name: "r1", Engine: src, Sink: sink})
	for i := range 40 {
		if i == 20 {
			replica.serve([]byte("sglang:num_running_reqs{tp_rank=\"0\" 1\n")) // a malformed body: an ordinary failure
		}
		if i == 21 {
			replica.serve(readTestdata(t, "sglang.txt"))
		}
		p.PollOnce(context.Background())
		clk.Advance(DefaultInterval)
	}
	found := logs.FilterMessage("replica exposes engine metrics").All()
	if len(found) != 1 || found[0].ContextMap()["engine"] != "sglang" {
		t.Errorf("logs %v", logs.All())
	}
	es := sink.engines()
	if h := p.Health()[0].Engine; h.Scrapes != 40 || h.Failures != 1 || len(es) != 39 {
		t.Errorf("health %+v, %d snapshots", h, len(es))
	}
	if s := es[len(es)-1]; s.Engine != EngineSGLang || s.Running != 12 || s.KVCapacityTokens != 459876 {
		t.Errorf("last snapshot %+v", *s)
	}
}
