package sim

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads one replica's /metrics into name → summed value (counters,
// gauges) for the samples whose labels contain all of want.
func scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	code, _, body := httpDo(t, "GET", url+"/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := name
			for _, l := range m.GetLabel() {
				if l.GetName() == "finished_reason" {
					key += "{" + l.GetValue() + "}"
				}
			}
			switch {
			case m.GetCounter() != nil:
				out[key] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key+"_count"] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// TestDisconnectFreesBlocks closes the client's TCP connection at different
// moments and checks that the sequence is aborted and its KV blocks freed at
// once (long before it would have finished), as vLLM does on disconnect.
func TestDisconnectFreesBlocks(t *testing.T) {
	est := testEstimator(t)
	longPrompt := est.Synthesize(8000, 7) // ≈2.4 s of prefill on qwen2.5-7b at speed 0.25
	cases := []struct {
		name, body string
		chunks     int // SSE events to read before closing; -1: close before reading anything
	}{
		{"during prefill", fmt.Sprintf(`{"model":"qwen","stream":true,"prompt":%q,"max_tokens":10}`, longPrompt), -1},
		{"non-streaming", fmt.Sprintf(`{"model":"qwen","prompt":%q,"max_tokens":10}`, longPrompt), -1},
		{"mid-stream", `{"model":"qwen","stream":true,"prompt":"go on","max_tokens":3000,"ignore_eos":true}`, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := startFleet(t, FleetConfig{Replicas: 1, Profiles: []Profile{mustBuiltin(t, "qwen2.5-7b")},
				ServedModelNames: []string{"qwen"}, Speeds: []float64{0.25}})
			r, u := f.Replicas()[0], f.URLs()[0]
			s := openStream(t, u, "/v1/completions", c.body)
			waitFor(t, 5*time.Second, "blocks allocated", func() bool { return r.State().UsedBlocks > 0 })
			if c.chunks > 0 {
				s.readHeader(t)
				for range c.chunks {
					if s.next(t) == "" {
						t.Fatal("stream ended early")
					}
				}
			}
			before := scrape(t, u)
			if before["vllm:kv_cache_usage_perc"] <= 0 || before["vllm:num_requests_running"] != 1 {
				t.Fatalf("before close: %v", before)
			}
			s.close()
			waitFor(t, 2*time.Second, "blocks freed", func() bool { return r.State().UsedBlocks == 0 })
			// Freed by the abort, not by finishing: the request had 3000
			// tokens (120 s) or a 2.4 s prefill ahead of it.
			after := scrape(t, u)
			if after["vllm:kv_cache_usage_perc"] != 0 || after["vllm:num_requests_running"] != 0 ||
				after["vllm:request_success_total{abort}"] != 1 || after["vllm:request_success_total{length}"] != 0 {
				t.Errorf("after close: %v", after)
			}
			if c.chunks < 0 && after["vllm:generation_tokens_total"] != 0 {
				t.Errorf("aborted during prefill but generated %v tokens", after["vllm:generation_tokens_total"])
			}
		})
	}
}

// TestStreamCompletionShape checks the completions SSE shape without usage.
func TestStreamCompletionShape(t *testing.T) {
	f := fastFleet(t, 1)
	s := openStream(t, f.URLs()[0], "/v1/completions",
		`{"model":"qwen","stream":true,"prompt":"count","max_tokens":5,"ignore_eos":true}`)
	defer s.close()
	s.readHeader(t)
	var n int
	var last chunk
	for {
		data := s.next(t)
		if data == "[DONE]" {
			break
		}
		if data == "" {
			t.Fatal("no [DONE]")
		}
		last = parseChunk(t, data)
		if last.Object != "text_completion" || last.Usage != nil || len(last.Choices) != 1 {
			t.Fatalf("chunk %s", data)
		}
		n += len(strings.Fields(last.Choices[0].Text))
	}
	if n != 5 || last.Choices[0].FinishReason == nil || *last.Choices[0].FinishReason != "length" {
		t.Errorf("%d tokens, last %+v", n, last)
	}
}
