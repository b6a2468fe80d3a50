package proxycost

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// sample is one run of one workload on one target.
type sample struct {
	count     int           // requests or events
	elapsed   time.Duration // wall time of the run
	p50       time.Duration // request latency, or event delay from its send stamp
	gapP50    time.Duration // SSE: inter-arrival of a stream's events
	coalesced float64       // SSE: share of gaps under a fifth of the interval
	proxyCPU  time.Duration
	others    time.Duration // utime+stime of every other process, one by one
	boxOthers time.Duration // /proc/stat's busy time less the harness's and the proxy's: what the quiet-box filter judges
	noisy     bool
}

func (s *sample) line() string {
	noisy := ""
	if s.noisy {
		noisy = " NOISY"
	}
	per := "-"
	if s.count > 0 && s.proxyCPU > 0 {
		per = fmt.Sprintf("%.1f", float64(s.proxyCPU.Microseconds())/float64(s.count))
	}
	return fmt.Sprintf("n=%d p50=%s cpu=%s (%s µs each) others=%s (processes %s)%s", s.count, s.p50.Round(time.Microsecond), s.proxyCPU, per, s.boxOthers, s.others, noisy)
}

// TargetResult holds one target's kept samples, by workload.
type TargetResult struct {
	Name     string
	measured bool // the target has processes whose CPU and memory count
	samples  map[string][]*sample
	baseRSS  int64     // after the warm-up
	idleRSS  []float64 // KiB per idle stream, one per rep
	noisy    []string  // runs kept although noisy
}

func (t *TargetResult) add(kind string, s *sample) {
	if t.samples == nil {
		t.samples = map[string][]*sample{}
	}
	t.samples[kind] = append(t.samples[kind], s)
}

// median of f over a workload's samples; NaN-free: 0 when none.
func (t *TargetResult) median(kind string, f func(*sample) float64) float64 {
	var v []float64
	for _, s := range t.samples[kind] {
		v = append(v, f(s))
	}
	return medianOf(v)
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func cpuPer(s *sample) float64 {
	if s.count == 0 {
		return 0
	}
	return us(s.proxyCPU) / float64(s.count)
}

// Figures are one target's medians, the row values of the table.
type Figures struct {
	Name           string   `json:"name"`
	P50C1us        float64  `json:"p50_c1_us"`
	AddedP50C1us   float64  `json:"added_p50_c1_us"`
	CPUPerReqUs    float64  `json:"cpu_per_request_c64_us"`
	ReqPerSec      float64  `json:"requests_per_second_c64"`
	SSEDelayP50us  float64  `json:"sse_delay_p50_us"`
	SSEAddedP50us  float64  `json:"sse_added_p50_us"`
	CPUPerEventUs  float64  `json:"cpu_per_event_us"`
	InterArrivalMs float64  `json:"sse_inter_arrival_p50_ms"`
	Coalesced      float64  `json:"sse_coalesced_share"`
	RSSPerStream   float64  `json:"rss_per_idle_stream_kib"`
	Measured       bool     `json:"measured"` // CPU and memory figures exist (not direct)
	NoisyRuns      []string `json:"noisy_runs,omitempty"`
}

// Result is a whole harness run.
type Result struct {
	Config    Config          `json:"-"`
	Started   time.Time       `json:"started"`
	Box       string          `json:"box"` // CPU, kernel, Go, and how an idle CPU waits (describeBox)
	Elapsed   time.Duration   `json:"elapsed_ns"`
	Runs      int             `json:"runs"`       // every run made, retries included
	Discarded int             `json:"discarded"`  // noisy runs rerun
	KeptNoisy int             `json:"kept_noisy"` // noisy after every retry: the quietest kept, marked
	Notes     []string        `json:"notes,omitempty"`
	Targets   []*TargetResult `json:"-"`
}

// Figures computes every target's medians, added latencies against direct.
func (r *Result) Figures() []Figures {
	out := make([]Figures, 0, len(r.Targets))
	var direct Figures
	for i, t := range r.Targets {
		f := Figures{Name: t.Name, Measured: t.measured, NoisyRuns: t.noisy}
		f.P50C1us = t.median("c=1", func(s *sample) float64 { return us(s.p50) })
		f.ReqPerSec = t.median("c=64", func(s *sample) float64 { return float64(s.count) / s.elapsed.Seconds() })
		f.SSEDelayP50us = t.median("sse", func(s *sample) float64 { return us(s.p50) })
		f.InterArrivalMs = t.median("sse", func(s *sample) float64 { return us(s.gapP50) / 1e3 })
		f.Coalesced = t.median("sse", func(s *sample) float64 { return s.coalesced })
		if t.measured {
			f.CPUPerReqUs = t.median("c=64", cpuPer)
			f.CPUPerEventUs = t.median("sse", cpuPer)
			f.RSSPerStream = medianOf(t.idleRSS)
		}
		if i == 0 {
			direct = f
		}
		f.AddedP50C1us = f.P50C1us - direct.P50C1us
		f.SSEAddedP50us = f.SSEDelayP50us - direct.SSEDelayP50us
		out = append(out, f)
	}
	return out
}

// WriteMarkdown prints the table, the acceptance checks of issue 15 and
// the conditions of the run.
func (r *Result) WriteMarkdown(w io.Writer) {
	fs := r.Figures()
	c := r.Config
	only := ""
	if len(c.Workloads) > 0 {
		only = "; workloads " + strings.Join(c.Workloads, ",") + " only"
	}
	fmt.Fprintf(w, "proxy cost, %s on %s (%s); %d reps interleaved, medians; runs %s (c=1 %s); requests %d B, replies %d B%s\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 MST"), hostname(), r.Box, c.Reps, c.Duration, c.C1Duration, c.RequestBytes, c.ReplyBytes, only)
	fmt.Fprint(w, "| |")
	for _, f := range fs {
		fmt.Fprintf(w, " %s |", f.Name)
	}
	fmt.Fprint(w, "\n|---|")
	for range fs {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	workload := "c1" // of the rows that follow: a workload not measured has none
	row := func(label string, cell func(Figures) string) {
		if !c.measures(workload) {
			return
		}
		fmt.Fprintf(w, "| %s |", label)
		for _, f := range fs {
			fmt.Fprintf(w, " %s |", cell(f))
		}
		fmt.Fprintln(w)
	}
	measured := func(format string, v func(Figures) float64) func(Figures) string {
		return func(f Figures) string {
			if !f.Measured {
				return "–"
			}
			return fmt.Sprintf(format, v(f))
		}
	}
	added := func(v func(Figures) float64, abs func(Figures) float64) func(Figures) string {
		return func(f Figures) string {
			if f.Name == fs[0].Name {
				return fmt.Sprintf("(%.0f)", abs(f))
			}
			return fmt.Sprintf("%+.0f", v(f))
		}
	}
	row("added p50 at c=1 (µs; direct: its p50)", added(func(f Figures) float64 { return f.AddedP50C1us }, func(f Figures) float64 { return f.P50C1us }))
	workload = "c64"
	row(fmt.Sprintf("proxy CPU per request at c=%d (µs)", c.Concurrency), measured("%.1f", func(f Figures) float64 { return f.CPUPerReqUs }))
	row(fmt.Sprintf("req/s at c=%d", c.Concurrency), func(f Figures) string { return fmt.Sprintf("%.1fk", f.ReqPerSec/1e3) })
	workload = "sse"
	row(fmt.Sprintf("SSE, %d streams: added p50 per event (µs; direct: its p50)", c.Streams), added(func(f Figures) float64 { return f.SSEAddedP50us }, func(f Figures) float64 { return f.SSEDelayP50us }))
	row("SSE: proxy CPU per event (µs)", measured("%.1f", func(f Figures) float64 { return f.CPUPerEventUs }))
	row(fmt.Sprintf("SSE: inter-arrival p50, events sent every %s (ms)", c.Interval), func(f Figures) string { return fmt.Sprintf("%.2f", f.InterArrivalMs) })
	row(fmt.Sprintf("SSE: gaps under %s (coalesced)", c.Interval/5), func(f Figures) string { return fmt.Sprintf("%.1f%%", 100*f.Coalesced) })
	workload = "idle"
	row(fmt.Sprintf("extra RSS per idle stream, %d streams (KiB)", c.IdleStreams), measured("%.1f", func(f Figures) float64 { return f.RSSPerStream }))
	fmt.Fprintf(w, "\n%d runs, %d noisy runs discarded and rerun, %d kept noisy after %d retries (other processes over %s of CPU in the run)\n",
		r.Runs, r.Discarded, r.KeptNoisy, c.Retries, c.QuietCPU)
	for _, f := range fs {
		if len(f.NoisyRuns) > 0 {
			fmt.Fprintf(w, "  noisy, %s: %s\n", f.Name, strings.Join(f.NoisyRuns, ", "))
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if checks := r.Acceptance(); len(checks) > 0 {
		fmt.Fprintln(w, "\nacceptance (issue 15):")
		for _, ch := range checks {
			fmt.Fprintf(w, "  %s\n", ch)
		}
	}
	if refs := r.Reference(); len(refs) > 0 {
		fmt.Fprintln(w, "\nthe same rules on the other proxies (for scale, not judged):")
		for _, ch := range refs {
			fmt.Fprintf(w, "  %s\n", ch)
		}
	}
}

// Acceptance judges gpurouter against the targets, where the
// comparison proxies ran.
func (r *Result) Acceptance() []string {
	return r.judge(func(name string) bool { return strings.HasPrefix(name, "gpurouter") })
}

// Reference judges the other proxies by the same rules, for scale and not
// as a verdict: where HAProxy, or epoll-bare (Go with none of the
// router's work), misses a bound too, the box sets that bound more than
// the router does. A proxy is not judged against itself.
func (r *Result) Reference() []string {
	return r.judge(func(name string) bool { return name != "direct" && !strings.HasPrefix(name, "gpurouter") })
}

// judge applies the rules to each column whose name picked
// reports (the first column is direct, never judged).
func (r *Result) judge(picked func(name string) bool) []string {
	by := map[string]Figures{}
	fs := r.Figures()
	for _, f := range fs {
		by[f.Name] = f
	}
	var out []string
	for _, g := range fs[min(1, len(fs)):] {
		if picked(g.Name) {
			out = append(out, acceptance(g, fs[0], by)...)
		}
	}
	return out
}

// acceptance judges one gpurouter column g against direct d and the
// comparison proxies in by.
func acceptance(g, d Figures, by map[string]Figures) []string {
	var out []string
	verdict := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "FAIL"
	}
	if h, ok := by["haproxy"]; ok && h.CPUPerReqUs > 0 && g.Name != h.Name {
		x := g.CPUPerReqUs / h.CPUPerReqUs
		out = append(out, fmt.Sprintf("%s %s 1. CPU per request %.1f µs = %.2f× HAProxy's %.1f (≤ 1.5×)", verdict(x <= 1.5), g.Name, g.CPUPerReqUs, x, h.CPUPerReqUs))
	}
	if n, ok := by["nginx"]; ok && n.CPUPerEventUs > 0 && g.Name != n.Name {
		x := g.CPUPerEventUs / n.CPUPerEventUs
		out = append(out, fmt.Sprintf("%s %s 2. CPU per event %.1f µs = %.2f× nginx's %.1f (≤ 1.1×)", verdict(x <= 1.1), g.Name, g.CPUPerEventUs, x, n.CPUPerEventUs))
	}
	if d.InterArrivalMs > 0 {
		x := g.InterArrivalMs/d.InterArrivalMs - 1
		out = append(out, fmt.Sprintf("%s %s 2. inter-arrival p50 %.2f ms, %+.1f%% from direct's %.2f (within 10%%)", verdict(x <= 0.1 && x >= -0.1), g.Name, g.InterArrivalMs, 100*x, d.InterArrivalMs))
	}
	if n, ok := by["nginx"]; ok && n.RSSPerStream > 0 && g.Name != n.Name {
		line := fmt.Sprintf("%s %s 3. RSS per idle stream %.1f KiB vs nginx's %.1f (≤ nginx's)", verdict(g.RSSPerStream <= n.RSSPerStream), g.Name, g.RSSPerStream, n.RSSPerStream)
		if h, ok := by["haproxy"]; ok && h.RSSPerStream > 0 && g.Name != h.Name {
			line += fmt.Sprintf("; %.1f× HAProxy's %.1f", g.RSSPerStream/h.RSSPerStream, h.RSSPerStream)
		}
		out = append(out, line)
	}
	if n, ok := by["nginx"]; ok && n.AddedP50C1us > 0 && g.Name != n.Name {
		x := g.AddedP50C1us / n.AddedP50C1us
		out = append(out, fmt.Sprintf("%s %s 4. added p50 at c=1 %+.0f µs = %.2f× nginx's %+.0f (≤ 1.2×)", verdict(x <= 1.2), g.Name, g.AddedP50C1us, x, n.AddedP50C1us))
	}
	return out
}

// WriteJSON writes the figures and the run's bookkeeping.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		*Result
		RequestBytes int       `json:"request_bytes"`
		ReplyBytes   int       `json:"reply_bytes"`
		Workloads    []string  `json:"workloads,omitempty"` // those measured, when not all: the others' figures are 0
		Figures      []Figures `json:"figures"`
		Acceptance   []string  `json:"acceptance,omitempty"`
		Reference    []string  `json:"reference,omitempty"` // the same rules on the other proxies
	}{r, r.Config.RequestBytes, r.Config.ReplyBytes, r.Config.Workloads, r.Figures(), r.Acceptance(), r.Reference()})
}
