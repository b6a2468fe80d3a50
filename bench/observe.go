package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/sketch"
)

// RouterHistogramNames maps comparison rows to the router's own histograms
// (same buckets as vLLM's, so they compare bucket by bucket).
func RouterHistogramNames() map[string][]string {
	return map[string][]string{
		RowTTFT:  {"gpurouter_time_to_first_token_seconds"},
		RowITL:   {"gpurouter_inter_token_latency_seconds"},
		RowTPOT:  {"gpurouter_request_time_per_output_token_seconds"},
		RowE2E:   {"gpurouter_e2e_request_latency_seconds"},
		RowQueue: {"gpurouter_request_queue_time_seconds"},
	}
}

// Observer watches the server side of one run: Before (from
// Config.OnMeasureStart) finds out whether BaseURL is a gpurouter and which
// engines are behind it, and scrapes the router's and the engines'
// /metrics; After scrapes them again, fetches the router's per-request
// records and joins everything into a ServerReport. It starts no
// goroutines. Only BaseURL is required.
type Observer struct {
	// BaseURL is the server the run targets (router or engine).
	BaseURL string
	// Model picks the router pool whose replicas are the engines; "" (or a
	// model no pool serves) means every pool's.
	Model string
	// EngineURLs are the engines to scrape (base URLs, or /metrics URLs);
	// nil means the router's replicas, or BaseURL itself when it is a bare
	// engine.
	EngineURLs []string
	// EngineMatch filters engine histograms by label (e.g. model_name).
	EngineMatch map[string]string
	// API reads the router's debug endpoints; nil means a default RouterAPI.
	API *RouterAPI
	// Scraper scrapes /metrics; nil means a default Scraper.
	Scraper *Scraper
	// Clock times the settling wait; nil means the real clock.
	Clock Clock
	// Settle bounds the wait after the run for the router's last records
	// and the engines' last observations, which may land just after the
	// client read [DONE]; 0 means 2 s.
	Settle time.Duration

	began        bool
	router       bool
	metricsURLs  []string
	poolModels   []string // the router pools the run's model goes to
	routerBefore Snapshot
	latBefore    *RouterLatency // the router's sketches at the start; nil when unread
	latErr       error          // why latBefore is nil
	engBefore    []Snapshot
	prefixBefore PrefixCounts // the router's prefix counters at the start
	beforeErr    error
}

// ServerReport is the server side of a run next to the client's.
type ServerReport struct {
	// Router says BaseURL is a gpurouter; without one there is no router
	// column, match or per-replica view.
	Router bool
	// MetricsURLs are the engine /metrics pages scraped.
	MetricsURLs []string
	// Match joins the client's records to the router's.
	Match RouterMatch
	// RouterHist is the router's histograms over the run, with its
	// sketches as the ITL and queue rows' Sketches when it has them.
	RouterHist HistogramColumn
	// RouterSketches are the router's ITL and queue-time sketches of the
	// run (GET /debug/latency): exact percentiles where its records keep
	// only each request's mean and maximum gap. nil when not read, and
	// SketchErr says why (ErrNoLatencyEndpoint: an older router); ITL
	// percentiles then come from RouterHist's buckets.
	RouterSketches *RouterSketches
	SketchErr      error
	// Engine is the engines' histograms over the run, summed over engines.
	Engine HistogramColumn
	// Phases are the engines' e2e, queue, prefill and decode histograms.
	Phases EnginePhases
	// Decomposition is the mean request's time, component by component.
	Decomposition Decomposition
	// Capacity is each replica's capacity as the router measured it (its
	// learned prefill rate, tokens/s, from GET /debug/pools after the run),
	// by replica name; nil when the router exposes none. The per-replica
	// table sets each replica's share of requests beside its share of it,
	// so a misrouting shows in every report.
	Capacity map[string]float64
	// PredictedPrefixHitRate is the share of the run's prompt tokens the
	// router's prefix index predicted cached where it placed them (the
	// replicas' counters in GET /debug/pools, after minus before); -1
	// when the router has no prefix index or the reads failed.
	PredictedPrefixHitRate float64
	// ForgonePrefixHitRate is the share of the run's prompt tokens that
	// another replica held cached beyond what the chosen one did, as the
	// router's index said: the hits its placements gave up for load or
	// an objective. -1 when PredictedPrefixHitRate is.
	ForgonePrefixHitRate float64
	// Err joins what could not be measured; the report is usable anyway.
	Err error
}

func (o *Observer) clock() Clock {
	if o.Clock == nil {
		return realClock{}
	}
	return o.Clock
}

func (o *Observer) scraper() *Scraper {
	if o.Scraper == nil {
		o.Scraper = &Scraper{}
	}
	return o.Scraper
}

func (o *Observer) api() *RouterAPI {
	if o.API == nil {
		o.API = &RouterAPI{}
	}
	return o.API
}

// Before discovers the router and the engines and takes the "before"
// scrapes. Problems are kept for the report; the error is only ctx's.
func (o *Observer) Before(ctx context.Context) error {
	o.began = true
	pools, err := o.api().Pools(ctx, o.BaseURL)
	switch {
	case err == nil:
		o.router = true
	case !errors.Is(err, ErrNotRouter):
		o.beforeErr = errors.Join(o.beforeErr, fmt.Errorf("router discovery: %w", err))
	}
	engines := o.EngineURLs
	if engines == nil {
		if o.router {
			engines = EngineURLs(pools, o.Model)
		} else {
			engines = []string{o.BaseURL}
		}
	}
	o.metricsURLs = make([]string, len(engines))
	for i, u := range engines {
		o.metricsURLs[i] = MetricsURL(u)
	}
	if o.router {
		o.prefixBefore = PrefixTotals(pools)
		o.poolModels = PoolModels(pools, o.Model)
		// The current window (the bench's clock; a router whose clock is
		// behind may answer the one before, which the end read covers too).
		o.latBefore, o.latErr = o.api().Latency(ctx, o.BaseURL, o.clock().Now(), time.Time{})
		o.routerBefore, err = o.scraper().Scrape(ctx, joinURL(o.BaseURL, "/metrics"))
		o.beforeErr = errors.Join(o.beforeErr, err)
	}
	var errs error
	o.engBefore, errs = o.scrapeEngines(ctx)
	o.beforeErr = errors.Join(o.beforeErr, errs)
	return ctx.Err()
}

// EngineMetricsURLs are the engines' /metrics pages Before found (nil
// before Before).
func (o *Observer) EngineMetricsURLs() []string { return o.metricsURLs }

// MetricsURL is u's /metrics page: u itself when it already ends so.
func MetricsURL(u string) string {
	u = strings.TrimRight(u, "/")
	if strings.HasSuffix(u, "/metrics") {
		return u
	}
	return u + "/metrics"
}

func (o *Observer) scrapeEngines(ctx context.Context) ([]Snapshot, error) {
	snaps := make([]Snapshot, len(o.metricsURLs))
	var errs error
	for i, u := range o.metricsURLs {
		var err error
		if snaps[i], err = o.scraper().Scrape(ctx, u); err != nil {
			errs = errors.Join(errs, err)
		}
	}
	return snaps, errs
}

// After builds the report of res. It waits up to Settle for the router to
// have recorded every completed client request and for the engines'
// request counts to cover them.
func (o *Observer) After(ctx context.Context, res *Result) *ServerReport {
	rep := &ServerReport{Router: o.router, MetricsURLs: o.metricsURLs, PredictedPrefixHitRate: -1, ForgonePrefixHitRate: -1}
	if !o.began {
		rep.Err = errors.New("bench: Observer.After without Before")
		return rep
	}
	errs := []error{o.beforeErr}
	settle := o.Settle
	if settle == 0 {
		settle = 2 * time.Second
	}
	clk := o.clock()
	deadline := clk.Now().Add(settle)
	wait := func() bool {
		if !clk.Now().Before(deadline) {
			return false
		}
		return clk.Sleep(ctx, 20*time.Millisecond) == nil
	}

	want := 0 // requests the engines must have finished
	for i := range res.Records {
		if res.Records[i].OK() {
			want++
		}
	}
	if o.router {
		// Records finish at or after the run's start; a minute of slack
		// covers clock skew between bench and router hosts (ids decide).
		since := res.Start.Add(-time.Minute)
		for {
			recs, err := o.api().Records(ctx, o.BaseURL, since, 0)
			if err != nil {
				errs = append(errs, fmt.Errorf("router records: %w", err))
				break
			}
			rep.Match = MatchRouterRecords(res, recs)
			if len(rep.Match.Unmatched) == 0 || !wait() {
				break
			}
		}
		want = len(rep.Match.Pairs)
	}

	e2eName, queueName, prefillName, decodeName := EnginePhaseNames()
	var after []Snapshot
	for {
		var err error
		after, err = o.scrapeEngines(ctx)
		if err != nil {
			errs = append(errs, err)
			break
		}
		h, err := sumDeltas(o.engBefore, after, e2eName, o.EngineMatch)
		if err != nil || h.Count >= float64(want) || !wait() {
			break
		}
	}
	var err error
	rep.Engine, err = ColumnFromSnapshots("engine", o.engBefore, after, VLLMHistogramNames(), o.EngineMatch)
	errs = append(errs, err)
	for _, ph := range []struct {
		h    *Histogram
		name string
	}{{&rep.Phases.E2E, e2eName}, {&rep.Phases.Queue, queueName}, {&rep.Phases.Prefill, prefillName}, {&rep.Phases.Decode, decodeName}} {
		if *ph.h, err = sumDeltas(o.engBefore, after, ph.name, o.EngineMatch); err != nil {
			errs = append(errs, fmt.Errorf("engine %s: %w", ph.name, err))
		}
	}
	if o.router {
		ra, err := o.scraper().Scrape(ctx, joinURL(o.BaseURL, "/metrics"))
		if err == nil {
			rep.RouterHist, err = ColumnFromSnapshots("router", []Snapshot{o.routerBefore}, []Snapshot{ra}, RouterHistogramNames(), nil)
		}
		errs = append(errs, err)
		rep.Capacity, rep.PredictedPrefixHitRate, rep.ForgonePrefixHitRate = o.capacity(ctx)
		rep.RouterSketches, rep.SketchErr = o.runSketches(ctx)
		if rs := rep.RouterSketches; rs != nil {
			rep.RouterHist.Sketches = map[string]*sketch.Snapshot{RowITL: &rs.ITL, RowQueue: &rs.Queue}
		}
	}
	var m *RouterMatch
	if o.router {
		m = &rep.Match
	}
	rep.Decomposition = Decompose(NewDecompositionInput(res, m, rep.Phases))
	rep.Err = errors.Join(errs...)
	return rep
}

// capacity reads each replica's measured prefill rate from the router's
// predictor (nil when it has none or the read fails: the report just
// lacks the column), and the run's predicted and forgone prefix-cache
// hit rates (Report.PredictedPrefixHitRate, ForgonePrefixHitRate).
func (o *Observer) capacity(ctx context.Context) (map[string]float64, float64, float64) {
	pools, err := o.api().Pools(ctx, o.BaseURL)
	if err != nil {
		return nil, -1, -1
	}
	hit := -1.0
	forgone := -1.0
	if t := PrefixTotals(pools); t.Prompt > o.prefixBefore.Prompt {
		n := float64(t.Prompt - o.prefixBefore.Prompt)
		hit = float64(t.Cached-o.prefixBefore.Cached) / n
		forgone = float64(t.Forgone-o.prefixBefore.Forgone) / n
	}
	var out map[string]float64
	for _, p := range pools {
		for _, r := range p.Replicas {
			if r.Predictor == nil || r.Predictor.TTFTSamples == 0 || r.Predictor.PrefillTokensPerS <= 0 {
				continue
			}
			if out == nil {
				out = map[string]float64{}
			}
			out[r.Name] = r.Predictor.PrefillTokensPerS
		}
	}
	return out, hit, forgone
}

// runSketches reads the router's sketches from the window the run started
// in and takes away what they held at the start.
func (o *Observer) runSketches(ctx context.Context) (*RouterSketches, error) {
	if o.latErr != nil {
		return nil, o.latErr
	}
	after, err := o.api().Latency(ctx, o.BaseURL, time.Unix(0, o.latBefore.FromUnixNs), time.Time{})
	if err != nil {
		return nil, err
	}
	rs, err := RunSketches(o.latBefore, after, o.poolModels)
	if err != nil {
		return nil, err
	}
	return &rs, nil
}

// sumDeltas is the delta of one histogram summed over servers; a server
// without a before snapshot (a failed scrape) counts as empty before.
func sumDeltas(before, after []Snapshot, name string, match map[string]string) (Histogram, error) {
	if len(after) == 0 {
		return Histogram{}, fmt.Errorf("%w: %s: no servers", ErrNoMetric, name)
	}
	var sum Histogram
	for i := range after {
		var b Snapshot
		if i < len(before) {
			b = before[i]
		}
		d, err := HistogramDelta(b, after[i], name, match)
		if err == nil {
			sum, err = sum.Add(d)
		}
		if err != nil {
			return Histogram{}, err
		}
	}
	return sum, nil
}

// ReplicaSummary is the router's view of one replica over the matched
// requests: how many it served and their mean latencies, in ms (MeanTPOT
// is NaN when no request had two tokens).
type ReplicaSummary struct {
	Replica                     string
	Requests                    int
	MeanTTFT, MeanTPOT, MeanE2E float64
	MeanQueue, MeanOutputTokens float64
}

// PredictorErr is the router's TTFT predictor's error over a run: P50 and
// P90 of |predicted − measured| in ms, and of that over the measured TTFT.
type PredictorErr struct {
	AbsMs50, AbsMs90, Rel50, Rel90 float64
}

// PredictorError compares, request by request, the TTFT the router
// predicted when it sent each matched request with the one it measured over
// the same span; n is how many requests had both.
func (m RouterMatch) PredictorError() (e PredictorErr, n int) {
	var abs, rel []float64
	for _, p := range m.Pairs {
		r := p.Router
		if r.PredictedTTFTS <= 0 || r.PlacedTTFTS <= 0 {
			continue
		}
		d := math.Abs(r.PredictedTTFTS - r.PlacedTTFTS)
		abs = append(abs, d*1000)
		rel = append(rel, d/r.PlacedTTFTS)
	}
	if len(abs) == 0 {
		return e, 0
	}
	slices.Sort(abs)
	slices.Sort(rel)
	q := func(xs []float64, p float64) float64 { return xs[min(len(xs)-1, int(p*float64(len(xs))))] }
	return PredictorErr{AbsMs50: q(abs, 0.5), AbsMs90: q(abs, 0.9), Rel50: q(rel, 0.5), Rel90: q(rel, 0.9)}, len(abs)
}

// PerRequestJSON is, for each matched request in the client's order, what
// the router saw of it: the replica that served it, its wait at the router
// and tries, its router-side TTFT, and the TTFT the predictor expected
// against the one measured over the same span (null when unknown) — the
// requests behind PredictorError's percentiles, so an outlier can be found
// and placed in its run.
func (m RouterMatch) PerRequestJSON() []map[string]any {
	out := make([]map[string]any, 0, len(m.Pairs))
	for _, p := range m.Pairs {
		r := p.Router
		out = append(out, map[string]any{
			"request_id": r.RequestID, "replica": r.Replica, "attempts": r.Attempts,
			"queue_s": r.QueueS, "ttft_s": r.TTFTS,
			"predicted_ttft_s": positiveOrNil(r.PredictedTTFTS), "placed_ttft_s": positiveOrNil(r.PlacedTTFTS),
		})
	}
	return out
}

func positiveOrNil(v float64) any {
	if v > 0 {
		return v
	}
	return nil
}

// ByReplica groups the matched requests by the replica that served them,
// in replica-name order.
func (m RouterMatch) ByReplica() []ReplicaSummary {
	type acc struct {
		n, tpotN, out          int
		ttft, tpot, e2e, queue float64
	}
	accs := map[string]*acc{}
	for _, p := range m.Pairs {
		r := p.Router
		a := accs[r.Replica]
		if a == nil {
			a = &acc{}
			accs[r.Replica] = a
		}
		a.n++
		a.ttft += r.TTFTS
		a.e2e += r.E2ES
		a.queue += r.QueueS
		a.out += r.CompletionTokens
		if r.CompletionTokens > 1 {
			a.tpot += r.TPOTSeconds()
			a.tpotN++
		}
	}
	out := make([]ReplicaSummary, 0, len(accs))
	for name, a := range accs {
		n := float64(a.n)
		s := ReplicaSummary{Replica: name, Requests: a.n, MeanTTFT: a.ttft / n * 1000, MeanE2E: a.e2e / n * 1000,
			MeanQueue: a.queue / n * 1000, MeanOutputTokens: float64(a.out) / n, MeanTPOT: math.NaN()}
		if a.tpotN > 0 {
			s.MeanTPOT = a.tpot / float64(a.tpotN) * 1000
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b ReplicaSummary) int { return strings.Compare(a.Replica, b.Replica) })
	return out
}
