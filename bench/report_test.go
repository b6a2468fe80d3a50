package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestWriteConsoleMatchesVLLM(t *testing.T) {
	res := timeline()
	res.Model, res.Endpoint, res.RequestRate, res.MaxConcurrency, res.MaxInFlight = "org/m", EndpointCompletions, 4, 8, 3
	s := Summarize(res, MetricOptions{PercentileMetrics: AllMetrics(), Percentiles: []float64{50, 99.9}, Goodput: SLO{TTFT: 150 * msec}})
	var buf bytes.Buffer
	if err := WriteConsole(&buf, res, s); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	lines := strings.Split(out, "\n")
	// Exact lines, trailing padding included ("{:<40} {:<10}").
	exact := []string{
		"============ Serving Benchmark Result ============",
		"Successful requests:                     3         ",
		"Failed requests:                         1         ",
		"Maximum request concurrency:             8         ",
		"Request rate configured (RPS):           4.00      ",
		"Benchmark duration (s):                  1.00      ",
		"Total input tokens:                      35        ",
		"Total generated tokens:                  7         ",
		"Request throughput (req/s):              3.00      ",
		"Request goodput (req/s):                 2.00      ",
		"Output token throughput (tok/s):         7.00      ",
		"Total Token throughput (tok/s):          42.00     ",
		"---------------Time to First Token----------------",
		"Mean TTFT (ms):                          116.67    ",
		"Median TTFT (ms):                        100.00    ",
		"P50 TTFT (ms):                           100.00    ",
		"-----Time per Output Token (excl. 1st token)------",
		"Mean TPOT (ms):                          30.00     ",
		"P99.9 TPOT (ms):                         39.98     ",
		"---------------Inter-token Latency----------------",
		"Median ITL (ms):                         25.00     ",
		"----------------End-to-end Latency----------------",
		"Mean E2EL (ms):                          150.00    ",
		"==================================================",
		"Failed (http_503):                       1         ",
	}
	for _, want := range exact {
		found := false
		for _, l := range lines {
			found = found || l == want
		}
		if !found {
			t.Errorf("no line %q in\n%s", want, out)
		}
	}
	for _, l := range lines {
		if len(l) > 0 && (strings.HasPrefix(l, "=") || strings.HasPrefix(l, "-")) && len(l) != 50 {
			t.Errorf("rule %q is %d wide, want 50", l, len(l))
		}
	}
	for _, want := range []string{"Client lag P99 (ms):", "End-to-end Latency by Use Case", "a                    2    0"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	// Default options: only ttft, tpot, itl sections, P99 only, no goodput.
	buf.Reset()
	res.RequestRate = 0
	if err := WriteConsole(&buf, res, Summarize(res, MetricOptions{})); err != nil {
		t.Fatal(err)
	}
	out = buf.String()
	for _, absent := range []string{"End-to-end Latency-", "Request goodput", "P50 TTFT", "Request rate configured"} {
		if strings.Contains(out, absent) {
			t.Errorf("default output has %q", absent)
		}
	}
	if !strings.Contains(out, "P99 ITL (ms):") {
		t.Error("default output lacks P99 ITL")
	}
}

func TestResultJSONKeys(t *testing.T) {
	res := timeline()
	res.Model, res.Endpoint, res.Start = "org/m", EndpointChat, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := Summarize(res, MetricOptions{Percentiles: []float64{50, 99}})
	var buf bytes.Buffer
	if err := WriteJSON(&buf, res, s, JSONMeta{NumPrompts: 4, Extra: map[string]any{"completed": "must not override", "x_extra": 1}}); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	keys := []string{"date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
		"completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
		"output_throughput", "total_token_throughput", "max_concurrent_requests", "max_output_tokens_per_s",
		"input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors",
		"gpurouter_request_ids", "gpurouter_failures_by_reason", "gpurouter_client_lag_p99_ms", "gpurouter_max_in_flight", "x_extra"}
	for _, metric := range AllMetrics() {
		for _, stat := range []string{"mean", "median", "std", "p50", "p99"} {
			keys = append(keys, stat+"_"+metric+"_ms")
		}
	}
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("missing key %q", k)
		}
	}
	if m["completed"] != 3.0 || m["failed"] != 1.0 || m["backend"] != "openai-chat" || m["request_rate"] != "inf" || m["max_concurrency"] != nil || m["request_goodput"] != nil {
		t.Errorf("values: completed %v failed %v backend %v rate %v conc %v goodput %v", m["completed"], m["failed"], m["backend"], m["request_rate"], m["max_concurrency"], m["request_goodput"])
	}
	if v := m["p99_ttft_ms"].(float64); !near(v, 198) {
		t.Errorf("p99_ttft_ms %v, want 198", v)
	}
	ttfts := m["ttfts"].([]any)
	errs := m["errors"].([]any)
	if len(ttfts) != 4 || ttfts[0] != 0.1 || ttfts[3] != 0.0 || errs[3] == "" || errs[0] != "" {
		t.Errorf("ttfts %v errors %v", ttfts, errs)
	}
	if itls := m["itls"].([]any); len(itls[0].([]any)) != 3 || len(itls[3].([]any)) != 0 {
		t.Errorf("itls %v", itls)
	}
}

func TestDefaultResultFilename(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		res  Result
		want string
	}{
		{"inf rate", Result{Model: "Qwen/Qwen2.5-7B-Instruct", Endpoint: EndpointCompletions, Start: start}, "openai-infqps-Qwen2.5-7B-Instruct-20260102-030405.json"},
		{"rate and concurrency", Result{Model: "m", Endpoint: EndpointChat, RequestRate: 10, MaxConcurrency: 64, Start: start}, "openai-chat-10.0qps-concurrency64-m-20260102-030405.json"},
		{"fractional rate", Result{Model: "m", RequestRate: 0.5, Start: start}, "openai-0.5qps-m-20260102-030405.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DefaultResultFilename(&tt.res, ""); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}
