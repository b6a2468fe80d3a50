package bench

import (
	"context"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// cancelClock cancels the run at its after-th Sleep: Run reads after times.
type cancelClock struct {
	sleeps, after int
	cancel        context.CancelFunc
}

func (c *cancelClock) Now() time.Time { return time.Unix(0, 0) }
func (c *cancelClock) Sleep(ctx context.Context, d time.Duration) error {
	if c.sleeps++; c.sleeps >= c.after {
		c.cancel()
	}
	return ctx.Err()
}

// fakeEngine serves page(i) as /metrics on its i-th scrape (0-based).
func fakeEngine(t *testing.T, page func(i int) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/plain; version=0.0.4")
		ctx.WriteString(page(int(n.Add(1) - 1)))
	}}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(); <-done })
	return "http://" + ln.Addr().String() + "/metrics"
}

func TestEngineSampler(t *testing.T) {
	v1 := fakeEngine(t, func(i int) string {
		return fmt.Sprintf("# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\"} %v\n"+
			"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total %d\n"+
			"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total %d\n"+
			"# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total %d\n",
			0.2*float64(i+1), 50+100*i, 1000+400*i, i)
	})
	legacy := fakeEngine(t, func(int) string {
		return "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{engine=\"0\"} 0.1\nvllm:gpu_cache_usage_perc{engine=\"1\"} 0.3\n"
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String() + "/metrics"
	ln.Close() // nothing listens there: every read fails

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &EngineSampler{URLs: []string{v1, legacy, gone}, Clock: &cancelClock{after: 3, cancel: cancel}}
	s.Run(ctx)
	got := s.Finish(context.Background())

	// Three reads in Run, one in Finish.
	if u := got[0]; u.KVSamples != 4 || math.Abs(u.MeanKVUsage-0.5) > 1e-9 || u.PrefixCacheHits != 300 ||
		u.PrefixCacheQueries != 1200 || u.Preemptions != 3 || u.PrefixCacheHitRate() != 0.25 {
		t.Errorf("v1 engine: %+v", u)
	}
	if u := got[1]; u.KVSamples != 4 || math.Abs(u.MeanKVUsage-0.2) > 1e-9 || u.PrefixCacheQueries != 0 || !math.IsNaN(u.PrefixCacheHitRate()) {
		t.Errorf("legacy engine (two engine cores, mean 0.2): %+v", u)
	}
	if u := got[2]; u.KVSamples != 0 || !math.IsNaN(u.MeanKVUsage) || s.Errors() != 4 {
		t.Errorf("unreachable engine: %+v, %d errors", u, s.Errors())
	}
	js := EngineUsageJSON(got)
	if js[0]["prefix_cache_hit_rate"] != 0.25 || js[2]["mean_kv_usage"] != nil {
		t.Errorf("json %v", js)
	}
}

// The simulator's LoRA swap counter, by source, as deltas over the run;
// an engine without it (a real vLLM) reports none.
func TestEngineSamplerLoRASwaps(t *testing.T) {
	sim := fakeEngine(t, func(i int) string {
		return fmt.Sprintf("# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.5\n"+
			"# TYPE gpurouter_sim_lora_swaps_total counter\ngpurouter_sim_lora_swaps_total{source=\"cpu\"} %d\n"+
			"gpurouter_sim_lora_swaps_total{source=\"disk\"} %d\n", 10+7*i, 3+i)
	})
	real := fakeEngine(t, func(int) string { return "vllm:kv_cache_usage_perc 0.5\n" })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &EngineSampler{URLs: []string{sim, real}, Clock: &cancelClock{after: 2, cancel: cancel}}
	s.Run(ctx)
	got := s.Finish(context.Background())
	if u := got[0]; !u.LoRASwapsRead || u.LoRASwapsCPU != 14 || u.LoRASwapsDisk != 2 {
		t.Errorf("simulated engine: %+v", u)
	}
	if u := got[1]; u.LoRASwapsRead || u.LoRASwapsCPU != 0 {
		t.Errorf("engine without the counter: %+v", u)
	}
	sw := TotalLoRASwaps(got, 400)
	if sw == nil || sw.CPU != 14 || sw.Disk != 2 || sw.PerKiloRequests() != 40 {
		t.Errorf("total %+v", sw)
	}
	if TotalLoRASwaps(got[1:], 400) != nil || !math.IsNaN((LoRASwaps{CPU: 1}).PerKiloRequests()) {
		t.Error("swaps without a counter, or a rate without requests")
	}
	if js := EngineUsageJSON(got); js[0]["lora_swaps_disk"] != 2.0 || js[1]["lora_swaps_disk"] != nil {
		t.Errorf("json %v", js)
	}
}
