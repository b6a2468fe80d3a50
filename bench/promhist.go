package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/valyala/fasthttp"
)

// Errors about scraped histograms.
var (
	ErrNoMetric          = errors.New("bench: no such histogram")
	ErrBucketMismatch    = errors.New("bench: histograms have different buckets")
	ErrCounterReset      = errors.New("bench: histogram went backwards (counter reset)")
	ErrMetricsParse      = errors.New("bench: cannot parse metrics")
	ErrMetricsHTTPStatus = errors.New("bench: metrics endpoint answered non-200")
)

// Snapshot is one parsed scrape of a Prometheus text /metrics page, keyed
// by metric family name (vLLM's names keep their colons: vllm:…).
type Snapshot map[string]*dto.MetricFamily

// ParseMetrics parses the Prometheus text format, accepting UTF-8 metric
// names (vLLM's contain ':').
func ParseMetrics(r io.Reader) (Snapshot, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMetricsParse, err)
	}
	return Snapshot(fams), nil
}

// Scraper fetches /metrics pages. The zero value is usable: a fresh
// fasthttp.Client and a 10 s timeout.
type Scraper struct {
	// Client does the requests; nil means a default fasthttp.Client.
	Client *fasthttp.Client
	// Timeout bounds one scrape; 0 means 10 s.
	Timeout time.Duration
}

// Scrape GETs url and parses it. ctx's deadline, when sooner, bounds it.
func (s *Scraper) Scrape(ctx context.Context, url string) (Snapshot, error) {
	c := s.Client
	if c == nil {
		c = &fasthttp.Client{Name: "gpurouter-bench"}
	}
	timeout := s.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	if err := c.DoDeadline(req, resp, deadline); err != nil {
		return nil, fmt.Errorf("bench: scrape %s: %w", url, err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return nil, fmt.Errorf("%w: %s: %d", ErrMetricsHTTPStatus, url, resp.StatusCode())
	}
	body, err := resp.BodyUncompressed()
	if err != nil {
		return nil, fmt.Errorf("bench: scrape %s: %w", url, err)
	}
	snap, err := ParseMetrics(bytesReaderOf(body))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return snap, nil
}

func bytesReaderOf(b []byte) io.Reader { return &bytesReader{b: b} }

// Histogram is a classic Prometheus histogram summed over the series a
// label filter selected. The zero value is an empty histogram with no
// buckets, which subtracts as zero.
type Histogram struct {
	// Bounds are the bucket upper bounds, ascending, ending with +Inf.
	Bounds []float64
	// Cumulative[i] counts observations ≤ Bounds[i].
	Cumulative []float64
	// Count and Sum are the _count and _sum samples.
	Count, Sum float64
}

// Histogram returns the histogram family name summed over every series
// whose labels include all of match (nil matches all), e.g.
// {"model_name": "Qwen/Qwen2.5-7B-Instruct"} sums a replica's engines.
func (s Snapshot) Histogram(name string, match map[string]string) (Histogram, error) {
	fam := s[name]
	if fam == nil || (fam.GetType() != dto.MetricType_HISTOGRAM && fam.GetType() != dto.MetricType_GAUGE_HISTOGRAM) {
		return Histogram{}, fmt.Errorf("%w: %s", ErrNoMetric, name)
	}
	var sum Histogram
	found := false
	for _, m := range fam.GetMetric() {
		if !labelsMatch(m.GetLabel(), match) || m.GetHistogram() == nil {
			continue
		}
		h := fromDTO(m.GetHistogram())
		var err error
		if sum, err = sum.Add(h); err != nil {
			return Histogram{}, fmt.Errorf("%s: %w", name, err)
		}
		found = true
	}
	if !found {
		return Histogram{}, fmt.Errorf("%w: %s with labels %v", ErrNoMetric, name, match)
	}
	return sum, nil
}

func labelsMatch(labels []*dto.LabelPair, match map[string]string) bool {
	for k, v := range match {
		ok := false
		for _, l := range labels {
			if l.GetName() == k && l.GetValue() == v {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func fromDTO(dh *dto.Histogram) Histogram {
	count := dh.GetSampleCountFloat()
	if count == 0 {
		count = float64(dh.GetSampleCount())
	}
	h := Histogram{Count: count, Sum: dh.GetSampleSum()}
	type bucket struct{ ub, c float64 }
	bs := make([]bucket, 0, len(dh.GetBucket())+1)
	hasInf := false
	for _, b := range dh.GetBucket() {
		c := b.GetCumulativeCountFloat()
		if c == 0 {
			c = float64(b.GetCumulativeCount())
		}
		bs = append(bs, bucket{b.GetUpperBound(), c})
		hasInf = hasInf || math.IsInf(b.GetUpperBound(), 1)
	}
	if !hasInf {
		bs = append(bs, bucket{math.Inf(1), count})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.ub, b.ub) })
	for _, b := range bs {
		if n := len(h.Bounds); n > 0 && h.Bounds[n-1] == b.ub {
			h.Cumulative[n-1] += b.c // duplicate bound: coalesce, as Prometheus does
			continue
		}
		h.Bounds = append(h.Bounds, b.ub)
		h.Cumulative = append(h.Cumulative, b.c)
	}
	return h
}

// Add returns h + o, bucket by bucket; the bounds must be equal unless one
// side is the zero Histogram.
func (h Histogram) Add(o Histogram) (Histogram, error) {
	return h.combine(o, +1)
}

// Sub returns h − before: the observations made between two scrapes. A
// zero before counts as empty; a bucket that shrank is ErrCounterReset.
func (h Histogram) Sub(before Histogram) (Histogram, error) {
	d, err := h.combine(before, -1)
	if err != nil {
		return Histogram{}, err
	}
	if d.Count < 0 {
		return Histogram{}, ErrCounterReset
	}
	for _, c := range d.Cumulative {
		if c < 0 {
			return Histogram{}, ErrCounterReset
		}
	}
	return d, nil
}

func (h Histogram) combine(o Histogram, sign float64) (Histogram, error) {
	if len(o.Bounds) == 0 {
		return h.clone(), nil
	}
	if len(h.Bounds) == 0 {
		h = Histogram{Bounds: o.Bounds, Cumulative: make([]float64, len(o.Bounds))}
	}
	if !slices.Equal(h.Bounds, o.Bounds) {
		return Histogram{}, fmt.Errorf("%w: %v vs %v", ErrBucketMismatch, h.Bounds, o.Bounds)
	}
	out := h.clone()
	for i := range out.Cumulative {
		out.Cumulative[i] += sign * o.Cumulative[i]
	}
	out.Count += sign * o.Count
	out.Sum += sign * o.Sum
	return out, nil
}

func (h Histogram) clone() Histogram {
	h.Bounds = slices.Clone(h.Bounds)
	h.Cumulative = slices.Clone(h.Cumulative)
	return h
}

// Observations is the number of observations (the +Inf bucket).
func (h Histogram) Observations() float64 {
	if len(h.Cumulative) == 0 {
		return 0
	}
	return h.Cumulative[len(h.Cumulative)-1]
}

// Mean is Sum/Count, NaN when empty.
func (h Histogram) Mean() float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	return h.Sum / h.Count
}

// Estimate is a quantile read from a histogram: Value as Prometheus'
// histogram_quantile computes it, and the bounds of the bucket it fell in,
// which is all the histogram knows (the error bar). Units are the
// histogram's (seconds for latency).
type Estimate struct {
	Value, Lower, Upper float64
}

// Resolved reports whether the bucket is narrow enough for its
// interpolated value to mean something: it starts above 0 and reaches at
// most half again its lower bound (Upper ≤ 1.5·Lower), so the value is off
// by less than half of itself whatever the distribution inside. In vLLM's
// first ITL bucket (0–10 ms), its 10–25 ms one or its 25–50 ms one, linear
// interpolation puts a median of 11 ms at 5 or 17 ms and a P99 of 25.4 ms
// at 39 ms: the bucket is all the histogram knows.
func (e Estimate) Resolved() bool {
	return e.Lower > 0 && !math.IsInf(e.Upper, 0) && e.Upper <= 1.5*e.Lower
}

// Quantile computes the q-quantile (0 ≤ q ≤ 1) exactly as Prometheus'
// histogram_quantile does for classic histograms: linear interpolation
// inside the bucket holding rank q·count, a lower bound of 0 for the first
// bucket when its upper bound is positive, and the highest finite bound
// when the rank falls in the +Inf bucket (then Upper is +Inf). No
// observations, or no +Inf bucket, give NaN; q < 0 gives −Inf, q > 1 +Inf.
func (h Histogram) Quantile(q float64) Estimate {
	nan := math.NaN()
	switch {
	case math.IsNaN(q):
		return Estimate{nan, nan, nan}
	case q < 0:
		return Estimate{math.Inf(-1), math.Inf(-1), math.Inf(-1)}
	case q > 1:
		return Estimate{math.Inf(1), math.Inf(1), math.Inf(1)}
	}
	n := len(h.Bounds)
	if n < 2 || !math.IsInf(h.Bounds[n-1], 1) {
		return Estimate{nan, nan, nan}
	}
	cum := monotonic(h.Cumulative)
	obs := cum[n-1]
	if obs == 0 {
		return Estimate{nan, nan, nan}
	}
	rank := q * obs
	b, _ := slices.BinarySearchFunc(cum[:n-1], rank, func(c, r float64) int {
		if c >= r {
			return 1
		}
		return -1
	})
	if b == n-1 {
		return Estimate{h.Bounds[n-2], h.Bounds[n-2], math.Inf(1)}
	}
	if b == 0 && h.Bounds[0] <= 0 {
		return Estimate{h.Bounds[0], math.Inf(-1), h.Bounds[0]}
	}
	start, end, count := 0.0, h.Bounds[b], cum[b]
	if b > 0 {
		start = h.Bounds[b-1]
		count -= cum[b-1]
		rank -= cum[b-1]
	}
	return Estimate{start + (end-start)*(rank/count), start, end}
}

// monotonic returns the running maximum of cumulative counts, as
// Prometheus forces monotonicity before interpolating.
func monotonic(c []float64) []float64 {
	out := slices.Clone(c)
	for i := 1; i < len(out); i++ {
		out[i] = max(out[i], out[i-1])
	}
	return out
}

// HistogramDelta is after − before for one histogram selected by name and
// label filter: the observations made during a run. A histogram missing
// from before (a fresh server) counts as empty.
func HistogramDelta(before, after Snapshot, name string, match map[string]string) (Histogram, error) {
	a, err := after.Histogram(name, match)
	if err != nil {
		return Histogram{}, err
	}
	b, err := before.Histogram(name, match)
	if err != nil && !errors.Is(err, ErrNoMetric) {
		return Histogram{}, err
	}
	d, err := a.Sub(b)
	if err != nil {
		return Histogram{}, fmt.Errorf("%s: %w", name, err)
	}
	return d, nil
}
