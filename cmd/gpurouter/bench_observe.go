package main

import (
	"context"
	"fmt"
	"io"

	"github.com/gpurouter/gpurouter/bench"
)

// serverSide is what `gpurouter bench` and `gpurouter demo` learned from the
// server side of a run: the router's and engines' columns, the breakdown of
// the mean request for the report, and the result file's extra keys.
type serverSide struct {
	report         *bench.ServerReport
	router, engine *bench.HistogramColumn // nil when not measured
	match          *bench.RouterMatch     // the run's requests joined to the router's records; nil without a router
	breakdown      *bench.LatencyBreakdown
	extra          map[string]any
}

// newObserver watches the server side of a run against cfg.BaseURL: a
// gpurouter (found through GET /debug/pools, its replicas being the
// engines unless engineURLs are given) or a bare engine. Call Before from
// cfg.OnMeasureStart and observeAfter when the run is over.
func newObserver(cfg bench.Config, engineURLs []string, match map[string]string) *bench.Observer {
	o := &bench.Observer{BaseURL: cfg.BaseURL, Model: cfg.Model, EngineMatch: match, API: &bench.RouterAPI{Headers: cfg.Headers}}
	if len(engineURLs) > 0 {
		o.EngineURLs = engineURLs
	}
	return o
}

// observeAfter finishes obs for res and prints the client/router/engine
// table and the decomposition, when there is a router or engine data to
// show; what could not be measured is reported on stderr.
func observeAfter(ctx context.Context, obs *bench.Observer, res *bench.Result, sum *bench.Summary, ps []float64, stdout, stderr io.Writer) (serverSide, error) {
	rep := obs.After(context.WithoutCancel(ctx), res)
	if rep.Err != nil {
		fmt.Fprintln(stderr, "bench: server side: not everything was measured:", rep.Err)
	}
	side := serverSide{report: rep, extra: map[string]any{}}
	if !rep.Router && len(rep.Engine.Rows) == 0 {
		return side, nil
	}
	if err := bench.WriteServerReport(stdout, sum, rep, ps); err != nil {
		return side, err
	}
	if rep.Router {
		side.router, side.match = &rep.RouterHist, &rep.Match
	}
	if len(rep.Engine.Rows) > 0 {
		side.engine = &rep.Engine
	}
	side.breakdown = breakdownOf(rep.Decomposition)
	side.extra = rep.JSON(ps)
	if rep.PredictedPrefixHitRate >= 0 {
		fmt.Fprintf(stdout, "Router's prefix index: %.1f%% of the prompt tokens predicted cached where they were sent\n", 100*rep.PredictedPrefixHitRate)
		side.extra["gpurouter_router_predicted_prefix_cache_hit_rate"] = rep.PredictedPrefixHitRate
	}
	if rep.ForgonePrefixHitRate >= 0 {
		fmt.Fprintf(stdout, "Router's prefix index: %.1f%% more was cached on another replica than where they were sent (given up for load or an objective)\n", 100*rep.ForgonePrefixHitRate)
		side.extra["gpurouter_router_forgone_prefix_cache_hit_rate"] = rep.ForgonePrefixHitRate
	}
	return side, nil
}

// breakdownOf turns the decomposition into the report's time allocation;
// NewLatencyBreakdown adds the residual (the same one: client mean e2e
// minus every measured component).
func breakdownOf(d bench.Decomposition) *bench.LatencyBreakdown {
	parts := make([]bench.BreakdownComponent, 0, len(d.Components))
	for _, c := range d.Components {
		parts = append(parts, bench.BreakdownComponent{Name: c.Name, Seconds: c.Seconds,
			Queue: c.Name == bench.CompRouterQueue || c.Name == bench.CompEngineQueue})
	}
	return bench.NewLatencyBreakdown(d.ClientE2E, parts...)
}

// engineSampling runs a bench.EngineSampler over the engines while the
// measured requests run. The zero value samples nothing until start.
type engineSampling struct {
	s      *bench.EngineSampler
	cancel context.CancelFunc
	done   chan struct{}
}

// start samples urls from now until stop; none means nothing to do.
func (e *engineSampling) start(ctx context.Context, urls []string) {
	if len(urls) == 0 {
		return
	}
	var sctx context.Context
	sctx, e.cancel = context.WithCancel(ctx)
	e.s, e.done = &bench.EngineSampler{URLs: urls}, make(chan struct{})
	go func() {
		defer close(e.done)
		e.s.Run(sctx)
	}()
}

// stop ends the sampling and returns each engine's usage over the run
// (nil when it never started).
func (e *engineSampling) stop(ctx context.Context) []bench.EngineUsage {
	if e.s == nil {
		return nil
	}
	e.cancel()
	<-e.done
	return e.s.Finish(context.WithoutCancel(ctx))
}

// printEngineUsage prints the engines' mean KV use and prefix-cache hits
// over the run, one line each.
func printEngineUsage(w io.Writer, us []bench.EngineUsage) {
	fmt.Fprintln(w, "Engines over the run (read every second): mean KV cache usage, prefix-cache hits / queried tokens, preemptions")
	for _, u := range us {
		fmt.Fprintf(w, "  %-40s KV %5.1f%% (%d reads)  prefix cache %.0f / %.0f (%.1f%%)  preempted %.0f", u.URL,
			100*u.MeanKVUsage, u.KVSamples, u.PrefixCacheHits, u.PrefixCacheQueries, 100*u.PrefixCacheHitRate(), u.Preemptions)
		if u.LoRASwapsRead {
			fmt.Fprintf(w, "  LoRA swaps %.0f cpu / %.0f disk", u.LoRASwapsCPU, u.LoRASwapsDisk)
		}
		fmt.Fprintln(w)
	}
}

// engineUsageRead reports whether any engine answered a read with a KV
// gauge (a target that is no vLLM engine gives nothing worth printing).
func engineUsageRead(us []bench.EngineUsage) bool {
	for _, u := range us {
		if u.KVSamples > 0 {
			return true
		}
	}
	return false
}

// splitEngines are --engine-url's engines by what the run reads them for.
type splitEngines struct {
	observed []string // the engine column's: colocated and decode engines
	prefill  []string // prefill engines' /metrics: phases and KV reads only
}

// splitEngineRoles reads --engine-url values (URL, prefill=URL,
// decode=URL) and returns each engine's role by its /metrics URL, as the
// sampler names engines.
func splitEngineRoles(vals []string) (splitEngines, map[string]bench.EngineRole, []string) {
	var s splitEngines
	roles := map[string]bench.EngineRole{}
	var errs []string
	for _, v := range vals {
		role, u, err := bench.ParseEngineURL(v)
		if err != nil {
			errs = append(errs, "--engine-url: "+err.Error())
			continue
		}
		roles[bench.MetricsURL(u)] = role
		if role == bench.RolePrefill {
			s.prefill = append(s.prefill, bench.MetricsURL(u))
		} else {
			s.observed = append(s.observed, u)
		}
	}
	return s, roles, errs
}
