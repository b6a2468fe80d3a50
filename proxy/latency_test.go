package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/proxy/observe"
	"github.com/gpurouter/gpurouter/sketch"
)

// fakeClock is the router's clock in these tests, set by the upstream: a
// token's arrival time is whatever the upstream says it is.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) add(d time.Duration) { c.ns.Add(int64(d)) }

// pacedUpstream streams tokens spaced by gaps on the router's fake clock:
// before writing token i it moves the clock on by the next gap, and after
// writing it waits for the client to have read it (ack), so the router
// reads token i at exactly the time the upstream set. Every gap the router
// measures is then a gap drawn here, with no timer or scheduler noise.
type pacedUpstream struct {
	url   string
	clock *fakeClock
	gaps  chan time.Duration // the next gap, for every token after a request's first
	ack   chan struct{}
}

func newPacedUpstream(t *testing.T, clock *fakeClock) *pacedUpstream {
	t.Helper()
	u := &pacedUpstream{clock: clock, gaps: make(chan time.Duration, 1<<16), ack: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.url = "http://" + ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			MaxTokens int `json:"max_tokens"`
		}
		body, _ := io.ReadAll(r.Body)
		json.Unmarshal(body, &req) //nolint:errcheck
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := range req.MaxTokens {
			if i > 0 {
				u.clock.add(<-u.gaps)
			}
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
			fl.Flush()
			select {
			case <-u.ack:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "data: [DONE]\n\n") //nolint:errcheck
		fl.Flush()
	})}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
	return u
}

// streamAcking posts a streamed chat request for n tokens and acknowledges
// every token event as it reads it.
func (u *pacedUpstream) streamAcking(t *testing.T, routerURL string, n int) {
	t.Helper()
	resp := post(t, routerURL+"/v1/chat/completions", fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, n))
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {") && strings.Contains(sc.Text(), `"content"`) {
			u.ack <- struct{}{}
		}
	}
}

// getLatency reads /debug/latency.
func getLatency(t *testing.T, routerURL, query string) observe.LatencyDoc {
	t.Helper()
	resp, err := http.Get(routerURL + "/debug/latency" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc observe.LatencyDoc
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&doc) != nil {
		t.Fatalf("GET /debug/latency%s: %d", query, resp.StatusCode)
	}
	return doc
}

// Acceptance: tokens spaced by a known distribution (a bimodal mix of a
// fast and a slow decode step with a lognormal spread, as a pool with a
// slower replica shows) come back from the router's /debug/latency with
// every percentile within 1% of the distribution's.
func TestRouterITLPercentilesMatchTheUpstreamsSpacing(t *testing.T) {
	clock := &fakeClock{}
	clock.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	up := newPacedUpstream(t, clock)
	tr := startRouterWith(t, []string{up.url}, func(o *Options) { o.Now = clock.now })
	start := clock.now()

	r := rand.New(rand.NewPCG(19, 1))
	const requests, tokens = 8, 400
	var want []time.Duration
	for range requests * (tokens - 1) {
		step := 12 * time.Millisecond
		if r.IntN(4) == 0 {
			step = 24 * time.Millisecond
		}
		g := time.Duration(float64(step) * math.Exp(0.15*r.NormFloat64()))
		want = append(want, g)
		up.gaps <- g
	}
	for range requests {
		up.streamAcking(t, tr.url, tokens)
		clock.add(10 * time.Second) // between requests: no gap is measured across them
	}
	slices.Sort(want)
	waitFor(t, "every request's record", func() bool { return len(tr.srv.records.Since(0, 0)) == requests })
	if took := clock.now().Sub(start); took < 2*observe.LatencyWindow {
		t.Fatalf("the run spans %v: it should cross several windows", took)
	}

	doc := getLatency(t, tr.url, fmt.Sprintf("?since=%d", start.UnixNano()))
	if len(doc.Pools) != 1 || len(doc.Pools[0].Replicas) != 1 {
		t.Fatalf("pools %+v", doc.Pools)
	}
	pool := doc.Pools[0]
	itl := pool.Replicas[0].ITL
	if itl.Count != uint64(len(want)) || pool.ITL.Count != itl.Count {
		t.Fatalf("%d gaps counted (pool %d), want %d", itl.Count, pool.ITL.Count, len(want))
	}
	var sum time.Duration
	for _, g := range want {
		sum += g
	}
	if mean := time.Duration(itl.MeanS * 1e9); math.Abs(float64(mean-sum/time.Duration(len(want)))) > 1000 {
		t.Errorf("mean %v, want %v (exact)", mean, sum/time.Duration(len(want)))
	}
	for _, lq := range observe.Quantiles() {
		// The rank DDSketch reads, and the interpolated percentile vllm
		// bench (numpy) prints: the router's answer is within 1% of both.
		exact := want[int(lq.Rank*float64(len(want)-1))]
		got := time.Duration(itl.Quantiles[lq.Name] * 1e9)
		for _, ref := range []time.Duration{exact, interpolated(want, lq.Rank)} {
			if rel := math.Abs(float64(got-ref)) / float64(ref); rel > 0.01 {
				t.Errorf("%s: router %v, distribution %v (%.2f%% off)", lq.Name, got, ref, 100*rel)
			}
		}
	}
	// Any other percentile, from the serialized sketch.
	for _, q := range []float64{0.05, 0.33, 0.8} {
		exact := want[int(q*float64(len(want)-1))]
		got, _ := itl.Sketch.Quantile(q)
		if rel := math.Abs(float64(got-exact)) / float64(exact); rel > 0.01 {
			t.Errorf("q%g from the sketch: %v, distribution %v", q, got, exact)
		}
	}
	if q := pool.Queue; q.Count != requests {
		t.Errorf("queue times counted: %d, want %d", q.Count, requests)
	}
}

// interpolated is numpy's linear percentile of sorted.
func interpolated(sorted []time.Duration, q float64) time.Duration {
	pos := q * float64(len(sorted)-1)
	lo := int(pos)
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + time.Duration((pos-float64(lo))*float64(sorted[hi]-sorted[lo]))
}

func TestDebugLatencyWindowsAndReplicas(t *testing.T) {
	clock := &fakeClock{}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a window boundary
	clock.ns.Store(base.UnixNano())
	up0, up1 := newPacedUpstream(t, clock), newPacedUpstream(t, clock)
	tr := startRouterWith(t, []string{up0.url, up1.url}, func(o *Options) { o.Now = clock.now })
	// round_robin: r0 then r1. r0's gaps are 10 ms in window 0; r1's 20 ms
	// in window 1.
	for range 9 {
		up0.gaps <- 10 * time.Millisecond
	}
	up0.streamAcking(t, tr.url, 10)
	clock.ns.Store(base.Add(observe.LatencyWindow).UnixNano())
	for range 4 {
		up1.gaps <- 20 * time.Millisecond
	}
	up1.streamAcking(t, tr.url, 5)
	waitFor(t, "both records", func() bool { return len(tr.srv.records.Since(0, 0)) == 2 })

	tests := []struct {
		name      string
		query     string
		r0, r1    uint64 // ITL counts
		fromDelta time.Duration
		toDelta   time.Duration
	}{
		{"everything retained", "", 9, 4, -observe.LatencyWindow * (observe.LatencyWindows - 2), 2 * observe.LatencyWindow},
		{"window 0", fmt.Sprintf("?since=%d&until=%d", base.UnixNano(), base.Add(time.Second).UnixNano()), 9, 0, 0, observe.LatencyWindow},
		{"window 1", fmt.Sprintf("?since=%d", base.Add(observe.LatencyWindow).UnixNano()), 0, 4, observe.LatencyWindow, 2 * observe.LatencyWindow},
		{"a future since reads the current window", fmt.Sprintf("?since=%d", base.Add(time.Hour).UnixNano()), 0, 4, observe.LatencyWindow, 2 * observe.LatencyWindow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := getLatency(t, tr.url, tt.query)
			if len(doc.Pools) != 1 || doc.Pools[0].Model != "m" || len(doc.Pools[0].Replicas) != 2 {
				t.Fatalf("pools %+v", doc.Pools)
			}
			reps := doc.Pools[0].Replicas
			if reps[0].Replica != "r0" || reps[1].Replica != "r1" || !reps[0].Served {
				t.Fatalf("replicas %+v", reps)
			}
			if reps[0].ITL.Count != tt.r0 || reps[1].ITL.Count != tt.r1 || doc.Pools[0].ITL.Count != tt.r0+tt.r1 {
				t.Errorf("ITL counts r0 %d r1 %d pool %d, want %d %d", reps[0].ITL.Count, reps[1].ITL.Count, doc.Pools[0].ITL.Count, tt.r0, tt.r1)
			}
			if got := time.Unix(0, doc.FromUnixNs).Sub(base); got != tt.fromDelta {
				t.Errorf("from %v, want %v", got, tt.fromDelta)
			}
			if doc.ToUnixNs != base.Add(tt.toDelta).UnixNano() || doc.RelativeAccuracy != sketch.RelativeAccuracy {
				t.Errorf("to %v accuracy %g", time.Unix(0, doc.ToUnixNs).Sub(base), doc.RelativeAccuracy)
			}
		})
	}
	doc := getLatency(t, tr.url, "")
	if p50 := doc.Pools[0].Replicas[1].ITL.Quantiles["p50"]; math.Abs(p50-0.020) > 0.0002 {
		t.Errorf("r1 ITL P50 %gs, want 20ms", p50)
	}
}

// A replica that leaves the route table stays readable for one retention,
// then its rings are dropped: memory follows the fleet.
func TestLatencyStoreRetiresReplicas(t *testing.T) {
	clock := &fakeClock{}
	clock.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	up := newPacedUpstream(t, clock)
	tr := startRouterWith(t, []string{up.url, up.url}, func(o *Options) { o.Now = clock.now })
	up.gaps <- 10 * time.Millisecond
	up.streamAcking(t, tr.url, 2) // r0
	waitFor(t, "the record", func() bool { return len(tr.srv.records.Since(0, 0)) == 1 })

	p, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: "round_robin"}, tr.reps[1:])
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.srv.SetRoutes([]Route{{Pool: p}}); err != nil {
		t.Fatal(err)
	}
	reps := getLatency(t, tr.url, "").Pools[0].Replicas
	if len(reps) != 2 || reps[0].Replica != "r0" || reps[0].Served || reps[0].ITL.Count != 1 || !reps[1].Served {
		t.Fatalf("after r0 left: %+v", reps)
	}
	clock.add(observe.LatencyWindow*observe.LatencyWindows + time.Second)
	if err := tr.srv.SetRoutes([]Route{{Pool: p}}); err != nil {
		t.Fatal(err)
	}
	reps = getLatency(t, tr.url, "").Pools[0].Replicas
	if len(reps) != 1 || reps[0].Replica != "r1" {
		t.Fatalf("after a retention: %+v", reps)
	}
}

// Recording a gap on the hot path allocates nothing.
func TestTokenChunkRecordsWithoutAllocating(t *testing.T) {
	s := &Server{cfg: Config{}.withDefaults(), now: time.Now, lat: observe.NewLatency()}
	x := &exchange{s: s, received: time.Now(), up: &upstream{lat: s.lat.Replica("m", "r0")}}
	now := time.Now()
	x.tokenChunk(now)
	if n := testing.AllocsPerRun(1000, func() { now = now.Add(12 * time.Millisecond); x.tokenChunk(now) }); n != 0 {
		t.Errorf("tokenChunk: %v allocations per gap", n)
	}
	if doc := s.lat.Collect(time.Time{}, now); len(doc.Pools) != 1 || doc.Pools[0].ITL.Count < 1000 {
		t.Errorf("gaps recorded: %+v", doc.Pools)
	}
}

// BenchmarkTokenChunkWithSketch is the router's per-token bookkeeping,
// the gap's sketch included.
func BenchmarkTokenChunkWithSketch(b *testing.B) {
	s := &Server{cfg: Config{}.withDefaults(), now: time.Now, lat: observe.NewLatency()}
	x := &exchange{s: s, received: time.Now(), up: &upstream{lat: s.lat.Replica("m", "r0")}}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(12 * time.Millisecond)
		x.tokenChunk(now)
	}
}
