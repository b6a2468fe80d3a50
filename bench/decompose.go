package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Where the mean request's time goes: the client's mean end-to-end latency
// split into what each side measured, with whatever no side accounts for
// shown as a residual, never folded into a component.
//
// Over n requests, with every mean taken over the same requests where the
// data allows it:
//
//	C   client e2e: client sent → last output chunk read (Record.E2E)
//	R   router e2e: router read the request → last token chunk relayed
//	Qr  router queue: router read the request → sent upstream (admission
//	    wait, picking, retries: RouterRecord.QueueS)
//	E   engine e2e: vllm:e2e_request_latency_seconds (the engine's
//	    frontend received the request → finished)
//	Qe  engine queue: vllm:request_queue_time_seconds (waiting to be
//	    scheduled)
//	P   prefill: vllm:request_prefill_time_seconds (scheduled → first token)
//	D   decode: vllm:request_decode_time_seconds (first → last token)
//
// C, R and Qr are means over the client's completed requests that the
// router also recorded (the same requests on both sides); E, Qe, P and D
// are sum/count of the engines' histogram deltas over the run, summed over
// engines (every request the engines finished in the window).
//
// The components are
//
//	network + router overhead  N = C − R, the mean of the per-request
//	                           difference client e2e − router e2e: the time
//	                           outside the router's clock, i.e. sending the
//	                           request to the router until it has read it,
//	                           and relaying the last token from the router's
//	                           write to the client's read
//	router queue               Qr
//	engine queue               Qe
//	prefill                    P
//	decode                     D
//
// and residual = C − (N + Qr + Qe + P + D). When every input is measured
// the residual splits exactly into two named parts, printed under it:
// router → engine (R − Qr − E: the router forwarding the request and
// relaying chunks, plus the router↔engine network) and engine frontend
// (E − Qe − P − D: the engine's HTTP server, tokenisation and
// detokenisation). Against a bare engine there is no N, R or Qr; the parts
// are then client ↔ engine (C − E) and engine frontend. A component that
// was not measured prints as "-" and its time stays in the residual.

// DecompositionInput are the means, in seconds, a Decomposition is built
// from (see the definitions above). NaN marks what was not measured.
type DecompositionInput struct {
	// Requests is how many client requests ClientE2E averages.
	Requests int
	// ClientE2E is C.
	ClientE2E float64
	// RouterE2E and RouterQueue are R and Qr, over the same requests as
	// ClientE2E; NaN without a router.
	RouterE2E, RouterQueue float64
	// EngineE2E, EngineQueue, Prefill and Decode are E, Qe, P and D.
	EngineE2E, EngineQueue, Prefill, Decode float64
}

// Component is one named share of the mean request, in seconds; NaN when
// it was not measured.
type Component struct {
	Name    string
	Seconds float64
}

// Names of the decomposition's components and of the residual's parts.
const (
	CompNetworkRouter  = "network + router overhead"
	CompRouterQueue    = "router queue"
	CompEngineQueue    = "engine queue"
	CompPrefill        = "prefill"
	CompDecode         = "decode"
	PartRouterEngine   = "router -> engine (R - Qr - E)"
	PartClientEngine   = "client <-> engine (C - E)"
	PartEngineFrontend = "engine frontend (E - Qe - P - D)"
)

// Decomposition is the mean request split into components and a residual,
// in seconds.
type Decomposition struct {
	Requests  int
	ClientE2E float64
	// Components are, in order: network + router overhead, router queue,
	// engine queue, prefill, decode.
	Components []Component
	// Residual is ClientE2E minus every measured component.
	Residual float64
	// ResidualParts are the named parts of the residual that could be
	// computed; they sum to Residual when every input was measured.
	ResidualParts []Component
	// Router says the run went through a router (N, R and Qr exist).
	Router bool
}

// Decompose computes the decomposition of in.
func Decompose(in DecompositionInput) Decomposition {
	router := !math.IsNaN(in.RouterE2E)
	d := Decomposition{Requests: in.Requests, ClientE2E: in.ClientE2E, Router: router}
	network := math.NaN()
	if router {
		network = in.ClientE2E - in.RouterE2E
	}
	d.Components = []Component{
		{CompNetworkRouter, network},
		{CompRouterQueue, in.RouterQueue},
		{CompEngineQueue, in.EngineQueue},
		{CompPrefill, in.Prefill},
		{CompDecode, in.Decode},
	}
	d.Residual = in.ClientE2E
	for _, c := range d.Components {
		if !math.IsNaN(c.Seconds) {
			d.Residual -= c.Seconds
		}
	}
	if router {
		d.ResidualParts = append(d.ResidualParts, Component{PartRouterEngine, in.RouterE2E - nanZero(in.RouterQueue) - in.EngineE2E})
	} else {
		d.ResidualParts = append(d.ResidualParts, Component{PartClientEngine, in.ClientE2E - in.EngineE2E})
	}
	d.ResidualParts = append(d.ResidualParts, Component{PartEngineFrontend, in.EngineE2E - in.EngineQueue - in.Prefill - in.Decode})
	parts := d.ResidualParts[:0]
	for _, p := range d.ResidualParts {
		if !math.IsNaN(p.Seconds) {
			parts = append(parts, p)
		}
	}
	d.ResidualParts = parts
	return d
}

// nanZero is v, or 0 for NaN (a router queue that was not reported is no
// queue).
func nanZero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}

// ResidualShare is |Residual| / ClientE2E, NaN when there is no e2e.
func (d Decomposition) ResidualShare() float64 {
	if !(d.ClientE2E > 0) {
		return math.NaN()
	}
	return math.Abs(d.Residual) / d.ClientE2E
}

// EnginePhases are the engines' histograms over a run (deltas, summed over
// engines). A zero Histogram is a phase that was not measured.
type EnginePhases struct {
	E2E, Queue, Prefill, Decode Histogram
}

// EnginePhaseNames maps each phase to vLLM's histogram name.
func EnginePhaseNames() (e2e, queue, prefill, decode string) {
	return "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
		"vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds"
}

// NewDecompositionInput gathers the means of a run: the client's and the
// router's over the matched requests when m has any, else the client's over
// its completed requests (and no router); the engines' from e.
func NewDecompositionInput(res *Result, m *RouterMatch, e EnginePhases) DecompositionInput {
	nan := math.NaN()
	in := DecompositionInput{RouterE2E: nan, RouterQueue: nan,
		EngineE2E: e.E2E.Mean(), EngineQueue: e.Queue.Mean(), Prefill: e.Prefill.Mean(), Decode: e.Decode.Mean()}
	if m != nil && len(m.Pairs) > 0 {
		var c, r, q float64
		for _, p := range m.Pairs {
			c += p.Client.E2E.Seconds()
			r += p.Router.E2ES
			q += p.Router.QueueS
		}
		n := float64(len(m.Pairs))
		in.Requests, in.ClientE2E, in.RouterE2E, in.RouterQueue = len(m.Pairs), c/n, r/n, q/n
		return in
	}
	var c float64
	for i := range res.Records {
		if r := &res.Records[i]; r.OK() {
			c += r.E2E.Seconds()
			in.Requests++
		}
	}
	in.ClientE2E = nan
	if in.Requests > 0 {
		in.ClientE2E = c / float64(in.Requests)
	}
	return in
}

// decompWidth is the decomposition block's width.
const decompWidth = 70

// WriteDecomposition prints d in ms, each line with its share of the
// client's mean e2e; the residual is always printed, with its parts.
func WriteDecomposition(w io.Writer, d Decomposition) error {
	c := &consoleWriter{w: w}
	c.line(center(" Where the Mean Request's Time Goes ", '=', decompWidth))
	who := "client"
	if d.Router {
		who = "client, matched to router"
	}
	c.line(fmt.Sprintf("%-50s %10d", "Requests ("+who+"):", d.Requests))
	row := func(label string, s float64) {
		label += " (ms):"
		if math.IsNaN(s) {
			c.line(fmt.Sprintf("%-50s %10s", label, "-"))
			return
		}
		share := ""
		if d.ClientE2E > 0 {
			share = fmt.Sprintf(" %6.1f%%", 100*s/d.ClientE2E)
		}
		c.line(fmt.Sprintf("%-50s %10.2f%s", label, s*1000, share))
	}
	capital := func(s string) string { return strings.ToUpper(s[:1]) + s[1:] }
	row("Client mean E2E", d.ClientE2E)
	for _, comp := range d.Components {
		row("  "+capital(comp.Name), comp.Seconds)
	}
	row("  Residual", d.Residual)
	for _, p := range d.ResidualParts {
		row("    of which "+p.Name, p.Seconds)
	}
	c.line(strings.Repeat("=", decompWidth))
	return c.err
}
