package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// JSONMeta is what a result file says about the run besides its numbers.
// The zero value writes nulls and empty strings.
type JSONMeta struct {
	// Label names the run in the file name and as "label"; "" means the
	// backend name, as in vllm.
	Label string
	// TokenizerID names the tokenizer that counted prompt tokens.
	TokenizerID string
	// NumPrompts is the dataset size asked for.
	NumPrompts int
	// Dataset is the dataset name.
	Dataset string
	// Extra keys are merged in (they must not collide with the standard
	// ones; later reports use this for router and engine columns).
	Extra map[string]any
}

// Backend is vllm bench's backend name for the endpoint: "openai" for
// completions, "openai-chat" for chat.
func (r *Result) Backend() string {
	if strings.HasSuffix(r.Endpoint, "/chat/completions") {
		return "openai-chat"
	}
	return "openai"
}

// pyFloat formats f as Python's str(float) does for the values that appear
// in file names: "inf", "10.0", "0.5".
func pyFloat(f float64) string {
	if math.IsInf(f, 1) {
		return "inf"
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// DefaultResultFilename is vllm bench's default name:
// {label}-{rate}qps[-concurrency{N}]-{model basename}-{YYYYmmdd-HHMMSS}.json.
func DefaultResultFilename(res *Result, label string) string {
	if label == "" {
		label = res.Backend()
	}
	rate := res.RequestRate
	if rate == 0 {
		rate = math.Inf(1)
	}
	conc := ""
	if res.MaxConcurrency > 0 {
		conc = fmt.Sprintf("-concurrency%d", res.MaxConcurrency)
	}
	model := res.Model
	if i := strings.LastIndexByte(model, '/'); i >= 0 {
		model = model[i+1:]
	}
	return fmt.Sprintf("%s-%sqps%s-%s-%s.json", label, pyFloat(rate), conc, model, res.Start.Format("20060102-150405"))
}

// ResultJSON builds the result file's object: vllm bench's keys wherever
// the quantity is the same (durations in s, latency stats in ms, per-request
// lists in s), and gpurouter's own under "gpurouter_" names.
func ResultJSON(res *Result, s *Summary, meta JSONMeta) map[string]any {
	label := meta.Label
	if label == "" {
		label = res.Backend()
	}
	var rate any = "inf"
	if res.RequestRate > 0 && !math.IsInf(res.RequestRate, 1) {
		rate = res.RequestRate
	}
	var maxConc any
	if res.MaxConcurrency > 0 {
		maxConc = res.MaxConcurrency
	}
	var goodput any
	if s.Options.Goodput.IsSet() {
		goodput = s.RequestGoodput
	}
	burst := res.Burstiness
	if burst == 0 {
		burst = 1
	}
	m := map[string]any{
		"date":         res.Start.Format("20060102-150405"),
		"backend":      res.Backend(),
		"label":        label,
		"model_id":     res.Model,
		"tokenizer_id": meta.TokenizerID,
		"num_prompts":  meta.NumPrompts,
		"request_rate": rate,
		"burstiness":   burst,

		"max_concurrency":         maxConc,
		"duration":                s.Duration.Seconds(),
		"completed":               s.Completed,
		"failed":                  s.Failed,
		"total_input_tokens":      s.TotalInput,
		"total_output_tokens":     s.TotalOutput,
		"request_throughput":      s.RequestThroughput,
		"request_goodput":         goodput,
		"output_throughput":       s.OutputThroughput,
		"total_token_throughput":  s.TotalTokenThroughput,
		"max_output_tokens_per_s": s.MaxOutputTokensPerS,
		"max_concurrent_requests": s.MaxConcurrentRequests,
	}
	for _, metric := range AllMetrics() {
		d := s.Dist(metric)
		m["mean_"+metric+"_ms"] = d.Mean
		m["median_"+metric+"_ms"] = d.Median
		m["std_"+metric+"_ms"] = d.Std
		for _, p := range d.Percentiles {
			m["p"+percentileLabel(p.P)+"_"+metric+"_ms"] = p.Value
		}
	}
	n := len(res.Records)
	inputLens, outputLens := make([]int, n), make([]int, n)
	ttfts, latencies, starts := make([]float64, n), make([]float64, n), make([]float64, n)
	itls := make([][]float64, n)
	errs, ids, reasons, useCases := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	lags, queues := make([]float64, n), make([]float64, n)
	for i := range res.Records {
		r := &res.Records[i]
		inputLens[i] = r.PromptTokens
		itls[i] = []float64{}
		if r.OK() {
			outputLens[i] = r.OutputTokens
			ttfts[i] = r.TTFT.Seconds()
			latencies[i] = r.E2E.Seconds()
			itls[i] = make([]float64, len(r.ITLs))
			for k, g := range r.ITLs {
				itls[i][k] = g.Seconds()
			}
		} else {
			reasons[i] = failureReason(r)
			errs[i] = r.Error
			if errs[i] == "" {
				errs[i] = reasons[i]
			}
		}
		starts[i] = r.Sent.Seconds()
		ids[i], useCases[i] = r.ID, r.UseCase
		lags[i], queues[i] = r.Lag.Seconds(), r.ClientQueue.Seconds()
	}
	m["input_lens"], m["output_lens"], m["ttfts"], m["itls"] = inputLens, outputLens, ttfts, itls
	m["latencies"], m["start_times"], m["errors"] = latencies, starts, errs

	m["gpurouter_dataset"] = meta.Dataset
	m["gpurouter_request_ids"] = ids
	m["gpurouter_use_cases"] = useCases
	m["gpurouter_failure_reasons"] = reasons
	m["gpurouter_client_lags"] = lags
	m["gpurouter_client_queue_times"] = queues
	m["gpurouter_failures_by_reason"] = s.FailuresByReason
	m["gpurouter_client_lag_p99_ms"] = s.Lag.At(99)
	m["gpurouter_client_lag_max_ms"] = s.Lag.Max
	m["gpurouter_mean_client_queue_ms"] = s.ClientQueue.Mean
	m["gpurouter_max_in_flight"] = res.MaxInFlight
	m["gpurouter_timed_replay"] = res.Timed
	m["gpurouter_warmups"] = len(res.Warmups)
	ucs := make([]map[string]any, 0, len(s.UseCases))
	for _, u := range s.UseCases {
		ucs = append(ucs, map[string]any{
			"name": u.Name, "completed": u.Completed, "failed": u.Failed,
			"p50_e2el_ms": u.P50, "p95_e2el_ms": u.P95, "p99_e2el_ms": u.P99, "mean_output_tokens": u.MeanOutputTokens,
		})
	}
	m["gpurouter_use_case_latency"] = ucs
	if len(s.Adapters) > 0 {
		models := make([]string, n)
		for i := range res.Records {
			models[i] = res.Records[i].Model
		}
		m["gpurouter_models"] = models
		as := make([]map[string]any, 0, len(s.Adapters))
		for _, a := range s.Adapters {
			as = append(as, map[string]any{
				"name": a.Name, "adapters": a.Adapters, "requests": a.Requests, "completed": a.Completed, "failed": a.Failed,
				"p50_ttft_ms": a.TTFTP50, "p99_ttft_ms": a.TTFTP99, "p50_e2el_ms": a.E2ELP50, "p99_e2el_ms": a.E2ELP99,
			})
		}
		m["gpurouter_adapter_latency"] = as
	}
	for k, v := range meta.Extra {
		if _, taken := m[k]; !taken {
			m[k] = v
		}
	}
	return m
}

// WriteJSON writes ResultJSON as indented JSON.
func WriteJSON(w io.Writer, res *Result, s *Summary, meta JSONMeta) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(ResultJSON(res, s, meta))
}
