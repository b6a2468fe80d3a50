package sim

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vllmNames are the series the issue requires, as exposed.
var vllmNames = []string{
	"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:cache_config_info",
	"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
	"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
	"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
	"vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
	"vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
	"vllm:request_inference_time_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
}

func metricFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	code, hdr, body := httpDo(t, "GET", url+"/metrics", "")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("/metrics = %d %v", code, hdr)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("expfmt: %v\n%s", err, body)
	}
	return mfs
}

func TestMetricsExposition(t *testing.T) {
	f := fastFleet(t, 1)
	u := f.URLs()[0]
	httpDo(t, "POST", u+"/v1/completions", `{"model":"qwen","prompt":"hello","max_tokens":4,"ignore_eos":true}`)
	mfs := metricFamilies(t, u)

	for _, name := range vllmNames {
		mf, ok := mfs[name]
		if !ok {
			t.Errorf("missing %s", name)
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["model_name"] != "qwen" || labels["engine"] != "0" {
				t.Errorf("%s labels %v, want model_name=qwen engine=0", name, labels)
			}
		}
	}
	if _, ok := mfs["vllm:gpu_cache_usage_perc"]; ok {
		t.Error("legacy KV gauge exposed without LegacyMetrics")
	}
	if _, ok := mfs["gpurouter_sim_step_lag_seconds"]; !ok {
		t.Error("missing gpurouter_sim_step_lag_seconds")
	}

	// Types and buckets as vLLM's.
	want := map[string][]float64{
		"vllm:time_to_first_token_seconds":           ttftBuckets(),
		"vllm:inter_token_latency_seconds":           itlBuckets(),
		"vllm:request_time_per_output_token_seconds": itlBuckets(),
		"vllm:e2e_request_latency_seconds":           requestLatencyBuckets(),
		"vllm:request_queue_time_seconds":            requestLatencyBuckets(),
		"vllm:request_prefill_time_seconds":          requestLatencyBuckets(),
		"vllm:request_decode_time_seconds":           requestLatencyBuckets(),
		"vllm:request_inference_time_seconds":        requestLatencyBuckets(),
		"vllm:request_prompt_tokens":                 {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000},
		"vllm:request_generation_tokens":             {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000},
	}
	for name, buckets := range want {
		mf := mfs[name]
		if mf.GetType() != dto.MetricType_HISTOGRAM {
			t.Errorf("%s is %v", name, mf.GetType())
			continue
		}
		var got []float64
		for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
			got = append(got, b.GetUpperBound())
		}
		if !slices.Equal(got, append(buckets, math.Inf(1))) {
			t.Errorf("%s buckets %v, want %v", name, got, buckets)
		}
	}
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
		if mfs[name].GetType() != dto.MetricType_GAUGE {
			t.Errorf("%s is not a gauge", name)
		}
	}
	for _, name := range []string{"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total"} {
		if mfs[name].GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s is not a counter", name)
		}
	}

	info := map[string]string{}
	for _, l := range mfs["vllm:cache_config_info"].GetMetric()[0].GetLabel() {
		info[l.GetName()] = l.GetValue()
	}
	if info["block_size"] != "16" || info["num_gpu_blocks"] != strconv.Itoa(f.Replicas()[0].NumGPUBlocks()) ||
		info["enable_prefix_caching"] != "True" || info["gpu_memory_utilization"] != "0.9" {
		t.Errorf("cache_config_info %v", info)
	}
	reasons := map[string]float64{}
	for _, m := range mfs["vllm:request_success_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "finished_reason" {
				reasons[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if len(reasons) != 3 || reasons["length"] != 1 {
		t.Errorf("request_success_total %v", reasons)
	}
	if v := mfs["vllm:generation_tokens_total"].GetMetric()[0].GetCounter().GetValue(); v != 4 {
		t.Errorf("generation_tokens_total %v, want 4", v)
	}
}

func TestLegacyMetricName(t *testing.T) {
	f := startFleet(t, FleetConfig{Replicas: 1, Profiles: []Profile{mustBuiltin(t, "tinyllama-1.1b-a10")}, LegacyMetrics: true})
	mfs := metricFamilies(t, f.URLs()[0])
	if _, ok := mfs["vllm:gpu_cache_usage_perc"]; !ok {
		t.Error("missing vllm:gpu_cache_usage_perc")
	}
	if _, ok := mfs["vllm:kv_cache_usage_perc"]; ok {
		t.Error("vllm:kv_cache_usage_perc exposed with LegacyMetrics")
	}
}
