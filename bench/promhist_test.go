package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// vLLM's TTFT buckets (DESIGN.md); the router uses the same.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}

// renderHistogram writes samples as one series of a Prometheus text
// histogram, labels sorted as prometheus_client prints them.
func renderHistogram(b *strings.Builder, name, labels string, bounds, samples []float64) {
	sep := ""
	if labels != "" {
		sep = ","
	}
	var sum float64
	for _, s := range samples {
		sum += s
	}
	for _, ub := range bounds {
		n := 0
		for _, s := range samples {
			if s <= ub {
				n++
			}
		}
		fmt.Fprintf(b, "%s_bucket{%s%sle=\"%v\"} %d.0\n", name, labels, sep, ub, n)
	}
	fmt.Fprintf(b, "%s_bucket{%s%sle=\"+Inf\"} %d.0\n", name, labels, sep, len(samples))
	fmt.Fprintf(b, "%s_count{%s} %d.0\n%s_sum{%s} %v\n", name, labels, len(samples), name, labels, sum)
}

func exposition(name string, series map[string][]float64, bounds []float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP %s Histogram.\n# TYPE %s histogram\n", name, name)
	keys := make([]string, 0, len(series))
	for k := range series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		renderHistogram(&b, name, k, bounds, series[k])
	}
	return b.String()
}

func TestQuantileMatchesHistogramQuantile(t *testing.T) {
	// Cumulative 10, 30, 60, 90, 100 at 0.1, 0.25, 0.5, 1, +Inf.
	h := Histogram{Bounds: []float64{0.1, 0.25, 0.5, 1, math.Inf(1)}, Cumulative: []float64{10, 30, 60, 90, 100}, Count: 100}
	tests := []struct {
		name   string
		q      float64
		want   Estimate
		wantNa bool
	}{
		{"first bucket interpolates from 0", 0.05, Estimate{0.05, 0, 0.1}, false},
		{"median", 0.5, Estimate{0.25 + 0.25*20/30, 0.25, 0.5}, false},
		{"rank on a bound", 0.9, Estimate{1, 0.5, 1}, false},
		{"in +Inf bucket: highest finite bound", 0.95, Estimate{1, 1, math.Inf(1)}, false},
		{"q > 1", 1.5, Estimate{math.Inf(1), math.Inf(1), math.Inf(1)}, false},
		{"q < 0", -0.1, Estimate{math.Inf(-1), math.Inf(-1), math.Inf(-1)}, false},
		{"q NaN", math.NaN(), Estimate{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := h.Quantile(tt.q)
			if tt.wantNa {
				if !math.IsNaN(got.Value) {
					t.Fatalf("got %+v, want NaN", got)
				}
				return
			}
			if !near(got.Value, tt.want.Value) || got.Lower != tt.want.Lower || got.Upper != tt.want.Upper {
				t.Fatalf("Quantile(%v) = %+v, want %+v", tt.q, got, tt.want)
			}
		})
	}
	if e := (Histogram{Bounds: []float64{1, math.Inf(1)}, Cumulative: []float64{0, 0}}).Quantile(0.5); !math.IsNaN(e.Value) {
		t.Errorf("empty histogram gave %+v, want NaN", e)
	}
	if e := (Histogram{Bounds: []float64{1, 2}, Cumulative: []float64{1, 2}}).Quantile(0.5); !math.IsNaN(e.Value) {
		t.Errorf("no +Inf bucket gave %+v, want NaN", e)
	}
	// Non-monotonic input is forced monotonic first, as Prometheus does.
	if e := (Histogram{Bounds: []float64{1, 2, math.Inf(1)}, Cumulative: []float64{5, 3, 10}}).Quantile(0.4); !near(e.Value, 0.8) {
		t.Errorf("non-monotonic: %+v, want 0.8", e)
	}
}

// A known distribution: the histogram's error bar must contain the sample's
// true quantile, and the mean must be exact (from _sum/_count).
func TestQuantileBracketsKnownDistribution(t *testing.T) {
	rng := newRand(5)
	samples := make([]float64, 20000)
	var sum float64
	for i := range samples {
		samples[i] = rng.ExpFloat64() * 0.2 // exponential, mean 200 ms
		sum += samples[i]
	}
	snap, err := ParseMetrics(strings.NewReader(exposition("vllm:time_to_first_token_seconds", map[string][]float64{`engine="0",model_name="m"`: samples}, ttftBuckets)))
	if err != nil {
		t.Fatal(err)
	}
	h, err := snap.Histogram("vllm:time_to_first_token_seconds", nil)
	if err != nil {
		t.Fatal(err)
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		truth := sorted[int(math.Ceil(q*float64(len(sorted))))-1]
		e := h.Quantile(q)
		if truth < e.Lower || truth > e.Upper || e.Value < e.Lower || e.Value > e.Upper {
			t.Errorf("q%v: truth %.4f, estimate %.4f in [%v, %v]", q, truth, e.Value, e.Lower, e.Upper)
		}
	}
	if !near(h.Mean(), sum/float64(len(samples))) {
		t.Errorf("mean %v, want %v", h.Mean(), sum/float64(len(samples)))
	}
}

func TestHistogramDeltaAcrossEnginesAndModels(t *testing.T) {
	const name = "vllm:inter_token_latency_seconds"
	bounds := []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2}
	before := exposition(name, map[string][]float64{
		`engine="0",model_name="a"`: {0.02, 0.02},
		`engine="1",model_name="a"`: {0.3},
		`engine="0",model_name="b"`: {0.01},
	}, bounds)
	after := exposition(name, map[string][]float64{
		`engine="0",model_name="a"`: {0.02, 0.02, 0.06, 0.06},
		`engine="1",model_name="a"`: {0.3, 0.06, 0.09},
		`engine="0",model_name="b"`: {0.01, 0.5, 0.5},
	}, bounds)
	b, err := ParseMetrics(strings.NewReader(before))
	if err != nil {
		t.Fatal(err)
	}
	a, err := ParseMetrics(strings.NewReader(after))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		match     map[string]string
		wantCount float64
		wantSum   float64
		wantP50   Estimate
	}{
		// Model a gained 0.06 0.06 0.06 0.09: all four in (0.05, 0.075] or (0.075, 0.1].
		{"model a, both engines", map[string]string{"model_name": "a"}, 4, 0.27, Estimate{0.05 + 0.025*2/3, 0.05, 0.075}},
		{"model a, engine 1", map[string]string{"model_name": "a", "engine": "1"}, 2, 0.15, Estimate{0.075, 0.05, 0.075}},
		{"everything", nil, 6, 1.27, Estimate{0.075, 0.05, 0.075}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := HistogramDelta(b, a, name, tt.match)
			if err != nil {
				t.Fatal(err)
			}
			if d.Count != tt.wantCount || !near(d.Sum, tt.wantSum) || d.Observations() != tt.wantCount {
				t.Fatalf("count %v sum %v obs %v, want %v %v", d.Count, d.Sum, d.Observations(), tt.wantCount, tt.wantSum)
			}
			if e := d.Quantile(0.5); !near(e.Value, tt.wantP50.Value) || e.Lower != tt.wantP50.Lower || e.Upper != tt.wantP50.Upper {
				t.Fatalf("p50 %+v, want %+v", e, tt.wantP50)
			}
		})
	}
	if _, err := HistogramDelta(a, b, name, nil); !errors.Is(err, ErrCounterReset) {
		t.Errorf("reversed delta: err %v, want ErrCounterReset", err)
	}
	if _, err := HistogramDelta(b, a, name, map[string]string{"model_name": "zzz"}); !errors.Is(err, ErrNoMetric) {
		t.Errorf("unknown model: err %v, want ErrNoMetric", err)
	}
	if _, err := HistogramDelta(b, a, "vllm:nope", nil); !errors.Is(err, ErrNoMetric) {
		t.Errorf("unknown metric: err %v, want ErrNoMetric", err)
	}
	// A histogram absent before the run (fresh server) counts as empty.
	d, err := HistogramDelta(Snapshot{}, a, name, map[string]string{"model_name": "b"})
	if err != nil || d.Count != 3 {
		t.Errorf("fresh server: %v, count %v", err, d.Count)
	}
	other := exposition(name, map[string][]float64{`model_name="a"`: {0.1}}, []float64{0.5, 1})
	o, _ := ParseMetrics(strings.NewReader(other))
	if _, err := HistogramDelta(o, a, name, nil); !errors.Is(err, ErrBucketMismatch) {
		t.Errorf("different buckets: err %v, want ErrBucketMismatch", err)
	}
}

func TestParseMetricsRealisticVLLMPage(t *testing.T) {
	page := `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 8.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 869.0
# HELP vllm:request_success_created Count of successfully processed requests.
# TYPE vllm:request_success_created gauge
vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e+09
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 12.5
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 10.0
# HELP gpurouter_ttft_seconds Router-side TTFT.
# TYPE gpurouter_ttft_seconds histogram
gpurouter_ttft_seconds_bucket{model="m",le="0.1"} 3
gpurouter_ttft_seconds_count{model="m"} 4
gpurouter_ttft_seconds_sum{model="m"} 0.5
`
	snap, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	h, err := snap.Histogram("vllm:e2e_request_latency_seconds", map[string]string{"model_name": "m"})
	if err != nil {
		t.Fatal(err)
	}
	if h.Count != 10 || len(h.Bounds) != 3 || h.Sum != 12.5 {
		t.Fatalf("e2e histogram %+v", h)
	}
	// Without an le="+Inf" line the count stands in for it.
	g, err := snap.Histogram("gpurouter_ttft_seconds", nil)
	if err != nil || len(g.Bounds) != 2 || g.Observations() != 4 {
		t.Fatalf("router histogram %+v, %v", g, err)
	}
	if _, err := snap.Histogram("vllm:num_requests_running", nil); !errors.Is(err, ErrNoMetric) {
		t.Errorf("gauge as histogram: %v", err)
	}
	if _, err := ParseMetrics(strings.NewReader("# TYPE x histogram\nx_bucket{le=\"1\"} oops\n")); !errors.Is(err, ErrMetricsParse) {
		t.Errorf("bad page: %v", err)
	}
}

func TestScraper(t *testing.T) {
	page := exposition("gpurouter_itl_seconds", map[string][]float64{`model="m"`: {0.02, 0.03}}, []float64{0.01, 0.025, 0.05})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/metrics" {
			ctx.SetStatusCode(404)
			return
		}
		ctx.SetContentType("text/plain; version=0.0.4")
		ctx.WriteString(page)
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()
	var s Scraper
	snap, err := s.Scrape(context.Background(), "http://"+ln.Addr().String()+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if h, err := snap.Histogram("gpurouter_itl_seconds", map[string]string{"model": "m"}); err != nil || h.Count != 2 {
		t.Fatalf("%+v %v", h, err)
	}
	if _, err := s.Scrape(context.Background(), "http://"+ln.Addr().String()+"/nope"); !errors.Is(err, ErrMetricsHTTPStatus) {
		t.Fatalf("404: %v", err)
	}
}

// FuzzHistogramQuantile feeds arbitrary metrics pages through parsing,
// histogram extraction and quantiles: nothing may panic, and a quantile of
// a histogram with observations lies within its reported bucket.
func FuzzHistogramQuantile(f *testing.F) {
	f.Add([]byte(exposition("vllm:time_to_first_token_seconds", map[string][]float64{`model_name="m"`: {0.01, 0.2, 3}}, ttftBuckets)), 0.5)
	f.Add([]byte("# TYPE h histogram\nh_bucket{le=\"-1\"} 2\nh_bucket{le=\"+Inf\"} 3\nh_count 3\nh_sum 1\n"), 0.1)
	f.Fuzz(func(t *testing.T, page []byte, q float64) {
		snap, err := ParseMetrics(strings.NewReader(string(page)))
		if err != nil {
			return
		}
		for name := range snap {
			h, err := snap.Histogram(name, nil)
			if err != nil {
				continue
			}
			e := h.Quantile(q)
			if q >= 0 && q <= 1 && !math.IsNaN(e.Value) && (e.Value < e.Lower || e.Value > e.Upper) {
				t.Fatalf("q%v: %+v outside its bucket", q, e)
			}
		}
	})
}
