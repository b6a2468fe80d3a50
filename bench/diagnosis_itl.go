package bench

import (
	"fmt"
	"math"
	"strings"
)

// The router-itl rule: does the router add queueing between tokens? It
// compares exact numbers only. The router's inter-token gaps (its sketch
// of every gap, within 0.5%, and each request's mean gap in its records)
// against the client's (every gap it read), which is where a router that
// holds tokens back would show; and the router's exact median against the
// engines' histogram only as far as the engines' buckets resolve it — a
// bucket that holds the router's median is consistent with it, and only a
// median outside the bucket is a difference.

// ITLComparison is what the router-itl rule weighs, in ms; NaN (or an empty
// Dist) is what was not measured.
type ITLComparison struct {
	// Client is the client's ITL median: every gap it read, exact.
	Client float64
	// Router is the router's median from its sketch of every gap, within
	// Accuracy (a fraction); NaN when the router had no sketches.
	Router, Accuracy float64
	// PerRequest is, over matched requests, the client's mean gap minus the
	// router's (RouterMatch.ITLDiffs).
	PerRequest Dist
	// RouterHist and Engine are the histograms' medians (seconds): the
	// router's, used only when it had no sketches, and the engines'.
	RouterHist, Engine Estimate
}

// itlComparison gathers the rule's inputs from a report's.
func (in *ReportInput) itlComparison() (ITLComparison, bool) {
	nan := math.NaN()
	c := ITLComparison{Client: nan, Router: nan, RouterHist: Estimate{nan, nan, nan}, Engine: Estimate{nan, nan, nan}}
	if in.Router == nil {
		return c, false
	}
	if s := in.summary(); s != nil && s.ITL.Count > 0 {
		c.Client = s.ITL.Median
	}
	if sk := in.Router.sketchOf(RowITL); sk != nil {
		v, _ := sk.Quantile(0.5)
		c.Router, c.Accuracy = ms(v), sk.RelativeAccuracy
	} else if h, ok := in.Router.Rows[RowITL]; ok && h.Count > 0 {
		c.RouterHist = h.Quantile(0.5)
	}
	if in.RouterMatch != nil {
		c.PerRequest = in.RouterMatch.ITLDiffs([]float64{50, 99})
	}
	if in.Engine != nil {
		if h, ok := in.Engine.Rows[RowITL]; ok && h.Count > 0 {
			c.Engine = h.Quantile(0.5)
		}
	}
	return c, true
}

// DiagnoseRouterITL judges the router's inter-token latency against the
// client's (exactly: the sketch's median and the per-request mean gaps)
// and against the engines' bucket. Without a router sketch or matched
// requests it falls back to the histograms: router and engine buckets
// that overlap agree. No finding when nothing comparable was measured.
func DiagnoseRouterITL(c ITLComparison) (Finding, bool) {
	exact := !math.IsNaN(c.Router) && !math.IsNaN(c.Client)
	if !exact && c.PerRequest.Count == 0 {
		return diagnoseITLBuckets(c.RouterHist, c.Engine)
	}
	f := Finding{Rule: "router-itl", Level: LevelOK}
	var facts []string
	diff := c.PerRequest.Mean
	if exact {
		facts = append(facts, fmt.Sprintf("P50 %.2f ms at the client, %.2f ms ±%g%% at the router (its sketch of every gap)", c.Client, c.Router, 100*c.Accuracy))
		diff = c.Client - c.Router
	}
	if c.PerRequest.Count > 0 {
		facts = append(facts, fmt.Sprintf("per request, the client's mean gap minus the router's is %+.3f ms on average, P99 %+.3f ms, over %d requests",
			c.PerRequest.Mean, c.PerRequest.At(99), c.PerRequest.Count))
	}
	detail := strings.Join(facts, "; ")
	// Agreement: within the sketch's accuracy plus 1%, or 0.2 ms.
	tol := max(0.2, (c.Accuracy+0.01)*c.Client)
	if math.IsNaN(tol) {
		tol = 0.2
	}
	var text strings.Builder
	switch {
	case diff > tol:
		f.Level = LevelWarn
		text.WriteString("ITL at the client exceeds ITL at the router: " + detail + ". Tokens wait between the router and the client — check the router's CPU, its flushing, and the network to the client.")
	case diff < -tol:
		f.Level = LevelInfo
		text.WriteString("ITL at the client is below ITL at the router: " + detail + ". The client split what the router relayed as one chunk, or read chunks late and together.")
	default:
		text.WriteString("ITL at the router equals ITL at the client: " + detail + ". The router adds no queueing between tokens.")
	}
	if exact && !math.IsNaN(c.Engine.Value) {
		level, s := routerInEngineBucket(c.Router, c.Accuracy, c.Engine)
		text.WriteString(" " + s)
		if level == LevelWarn || (level == LevelInfo && f.Level == LevelOK) {
			f.Level = level
		}
	}
	f.Text = text.String()
	return f, true
}

// routerInEngineBucket places the router's exact median (ms) against the
// engines' bucket: inside it they agree as far as the bucket can tell;
// outside it they differ whatever the buckets' resolution.
func routerInEngineBucket(router, accuracy float64, engine Estimate) (level, text string) {
	lo, hi := max(engine.Lower, 0)*1000, engine.Upper*1000
	bucket := fmt.Sprintf("%s–%s ms", boundMS(max(engine.Lower, 0)), boundMS(engine.Upper))
	slack := accuracy * router
	switch {
	case router > hi+slack:
		return LevelWarn, fmt.Sprintf("The engines' ITL median lies in %s, below the router's: tokens wait between engine and router — check the router's CPU, its flushing, and the network to the replicas.", bucket)
	case router < lo-slack:
		return LevelInfo, fmt.Sprintf("The engines' ITL median lies in %s, above the router's: the engines' histograms include requests the router did not send, or chunks were merged on the way.", bucket)
	case engine.Resolved():
		return LevelOK, fmt.Sprintf("The engines' ITL median (%.2f ms in %s) agrees within its bucket.", engine.Value*1000, bucket)
	}
	return LevelOK, fmt.Sprintf("The engines' ITL median lies in %s, which holds the router's; their buckets resolve nothing finer.", bucket)
}

// diagnoseITLBuckets is the rule with histograms only (a router without
// sketches and no matched requests): the router's and engines' medians
// agree when their buckets overlap.
func diagnoseITLBuckets(router, engine Estimate) (Finding, bool) {
	if math.IsNaN(router.Value) || math.IsNaN(engine.Value) {
		return Finding{}, false
	}
	desc := fmt.Sprintf("router P50 in %s, engine P50 in %s", estimateCell(router), estimateCell(engine))
	f := Finding{Rule: "router-itl"}
	switch {
	case estimatesAgree(router, engine):
		f.Level = LevelOK
		f.Text = "ITL at router equals ITL at engine within bucket error (" + desc + "): the router adds no queueing."
	case router.Value > engine.Value:
		f.Level = LevelWarn
		f.Text = "ITL at the router exceeds ITL at the engine beyond bucket error (" + desc + "): tokens wait between engine and router — check the router's CPU, its flushing, and the network to the replicas."
	default:
		f.Level = LevelInfo
		f.Text = "ITL at the router is below ITL at the engine beyond bucket error (" + desc + "): the engines' histograms include requests the router did not send, or chunks were merged on the way."
	}
	return f, true
}

// estimatesAgree reports whether two histogram quantiles agree within
// bucket error: equal values, or bucket intervals that overlap.
func estimatesAgree(a, b Estimate) bool {
	if a.Value == b.Value {
		return true
	}
	return max(a.Lower, b.Lower) < min(a.Upper, b.Upper)
}
