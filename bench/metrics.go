package bench

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// MetricOptions chooses what Summarize reports. The zero value is vllm
// bench's default: percentiles of ttft, tpot and itl at P99, no goodput.
type MetricOptions struct {
	// PercentileMetrics are the sections printed (a subset of AllMetrics);
	// nil means ttft, tpot, itl. JSON output always has all four.
	PercentileMetrics []string
	// Percentiles to report, in [0, 100]; nil means 99.
	Percentiles []float64
	// Goodput is the SLO for request_goodput; unset means no goodput.
	Goodput SLO
	// TopAdapters is how many adapters Summary.Adapters shows on their
	// own before the others bucket; 0 means 8.
	TopAdapters int
}

func (o MetricOptions) withDefaults() MetricOptions {
	if o.PercentileMetrics == nil {
		o.PercentileMetrics = []string{MetricTTFT, MetricTPOT, MetricITL}
	}
	if o.Percentiles == nil {
		o.Percentiles = []float64{99}
	}
	if o.TopAdapters <= 0 {
		o.TopAdapters = 8
	}
	return o
}

// Summary is a Result reduced to vllm bench's metrics plus gpurouter's own
// (failures by reason, client lag, per-use-case latency). Latencies are in
// ms, throughputs per second of Duration. The zero value is an empty run.
type Summary struct {
	Options MetricOptions

	Completed, Failed int
	Duration          time.Duration
	// Input and output token totals over completed requests.
	TotalInput, TotalOutput int

	RequestThroughput    float64 // completed / s
	RequestGoodput       float64 // requests meeting every SLO / s; 0 unless Options.Goodput is set
	GoodRequests         int
	OutputThroughput     float64 // output tokens / s
	TotalTokenThroughput float64 // (input + output) tokens / s
	// MaxOutputTokensPerS is the most output chunks in any one-second
	// window from the first send (vllm's peak output token throughput).
	MaxOutputTokensPerS float64
	// MaxConcurrentRequests is the most requests open at once, from the
	// records' send and end times.
	MaxConcurrentRequests int

	TTFT, TPOT, ITL, E2EL Dist

	// ClientQueue is the time spent waiting for a --max-concurrency slot;
	// Lag the load generator's own delay (see Record.Lag). Over every
	// request sent.
	ClientQueue, Lag Dist
	// FailuresByReason counts failed requests by Record.Reason.
	FailuresByReason map[string]int
	// UseCases has one entry per use case label, shortest mean output
	// first (for the usecase mix: ultra-short Q&A … long-form); empty when
	// no request has a label.
	UseCases []UseCaseSummary
	// Adapters is the latency per LoRA adapter (Record.Model) of the
	// Options.TopAdapters adapters with the most requests, then one
	// OthersAdapter entry for the rest; empty when no request named an
	// adapter.
	Adapters []AdapterSummary
}

// UseCaseSummary is the end-to-end latency of one use case's completed
// requests, in ms.
type UseCaseSummary struct {
	Name              string
	Completed, Failed int
	P50, P95, P99     float64
	MeanOutputTokens  float64
}

// Dist returns the distribution of one of AllMetrics.
func (s *Summary) Dist(metric string) Dist {
	switch metric {
	case MetricTTFT:
		return s.TTFT
	case MetricTPOT:
		return s.TPOT
	case MetricITL:
		return s.ITL
	default:
		return s.E2EL
	}
}

// Summarize computes the metrics of res with DESIGN.md's definitions (the
// same as vllm bench's): TTFT, E2EL and token totals over completed
// requests; TPOT per completed request with more than one output token;
// ITL pooled over every gap of every completed request.
func Summarize(res *Result, o MetricOptions) *Summary {
	o = o.withDefaults()
	s := &Summary{Options: o, Duration: res.Duration, FailuresByReason: map[string]int{}}
	var ttft, tpot, itl, e2el, queue, lag []float64
	ucIndex := map[string]int{}
	ucE2E := map[string][]float64{}
	ucOut := map[string]int{}
	for i := range res.Records {
		r := &res.Records[i]
		queue = append(queue, ms(r.ClientQueue))
		lag = append(lag, ms(r.Lag))
		if r.UseCase != "" {
			if _, ok := ucIndex[r.UseCase]; !ok {
				ucIndex[r.UseCase] = len(s.UseCases)
				s.UseCases = append(s.UseCases, UseCaseSummary{Name: r.UseCase})
			}
		}
		if !r.OK() {
			s.Failed++
			s.FailuresByReason[failureReason(r)]++
			if r.UseCase != "" {
				s.UseCases[ucIndex[r.UseCase]].Failed++
			}
			continue
		}
		s.Completed++
		s.TotalInput += r.PromptTokens
		s.TotalOutput += r.OutputTokens
		ttft = append(ttft, ms(r.TTFT))
		e2el = append(e2el, ms(r.E2E))
		if r.OutputTokens > 1 {
			tpot = append(tpot, ms(r.TPOT()))
		}
		for _, g := range r.ITLs {
			itl = append(itl, ms(g))
		}
		if o.Goodput.IsSet() && good(r, o.Goodput) {
			s.GoodRequests++
		}
		if r.UseCase != "" {
			s.UseCases[ucIndex[r.UseCase]].Completed++
			ucE2E[r.UseCase] = append(ucE2E[r.UseCase], ms(r.E2E))
			ucOut[r.UseCase] += r.OutputTokens
		}
	}
	ps := o.Percentiles
	s.TTFT, s.TPOT, s.ITL, s.E2EL = newDist(ttft, ps), newDist(tpot, ps), newDist(itl, ps), newDist(e2el, ps)
	s.ClientQueue, s.Lag = newDist(queue, ps), newDist(lag, []float64{99})
	for i := range s.UseCases {
		u := &s.UseCases[i]
		d := newDist(ucE2E[u.Name], []float64{50, 95, 99})
		u.P50, u.P95, u.P99 = d.Percentiles[0].Value, d.Percentiles[1].Value, d.Percentiles[2].Value
		if u.Completed > 0 {
			u.MeanOutputTokens = float64(ucOut[u.Name]) / float64(u.Completed)
		}
	}
	slices.SortStableFunc(s.UseCases, func(a, b UseCaseSummary) int {
		if c := cmp.Compare(a.MeanOutputTokens, b.MeanOutputTokens); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	if sec := res.Duration.Seconds(); sec > 0 {
		s.RequestThroughput = float64(s.Completed) / sec
		s.OutputThroughput = float64(s.TotalOutput) / sec
		s.TotalTokenThroughput = float64(s.TotalInput+s.TotalOutput) / sec
		if o.Goodput.IsSet() {
			s.RequestGoodput = float64(s.GoodRequests) / sec
		}
	}
	s.Adapters = summarizeAdapters(res.Records, o.TopAdapters)
	s.MaxConcurrentRequests = maxConcurrent(res.Records)
	s.MaxOutputTokensPerS = peakTokensPerSecond(res.Records)
	return s
}

func failureReason(r *Record) string {
	if r.Reason == "" {
		return ReasonNoContent
	}
	return r.Reason
}

// good reports whether r meets every set bound of slo; a one-token request
// has TPOT 0, as in vllm.
func good(r *Record, slo SLO) bool {
	return (slo.TTFT == 0 || r.TTFT <= slo.TTFT) &&
		(slo.TPOT == 0 || r.TPOT() <= slo.TPOT) &&
		(slo.E2EL == 0 || r.E2E <= slo.E2EL)
}

// maxConcurrent is the peak of a sweep over [Sent, End] of every request;
// at equal times an end is taken before a start.
func maxConcurrent(recs []Record) int {
	type ev struct {
		t     time.Duration
		delta int
	}
	evs := make([]ev, 0, 2*len(recs))
	for i := range recs {
		evs = append(evs, ev{recs[i].Sent, +1}, ev{max(recs[i].End, recs[i].Sent), -1})
	}
	slices.SortFunc(evs, func(a, b ev) int {
		if c := cmp.Compare(a.t, b.t); c != 0 {
			return c
		}
		return cmp.Compare(a.delta, b.delta)
	})
	cur, peak := 0, 0
	for _, e := range evs {
		cur += e.delta
		peak = max(peak, cur)
	}
	return peak
}

// peakTokensPerSecond places every output chunk of completed requests at
// Sent+TTFT+ΣITL and counts them in one-second buckets from the earliest
// send, as vllm bench does for its peak output throughput.
func peakTokensPerSecond(recs []Record) float64 {
	first := time.Duration(math.MaxInt64)
	for i := range recs {
		if recs[i].OK() {
			first = min(first, recs[i].Sent)
		}
	}
	buckets := map[int64]int{}
	peak := 0
	for i := range recs {
		r := &recs[i]
		if !r.OK() {
			continue
		}
		t := r.Sent + r.TTFT
		for k := 0; ; k++ {
			b := int64((t - first) / time.Second)
			buckets[b]++
			peak = max(peak, buckets[b])
			if k == len(r.ITLs) {
				break
			}
			t += r.ITLs[k]
		}
	}
	return float64(peak)
}
