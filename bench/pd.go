package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// A prefill/decode split serves each client request twice: the router
// sends it to a prefill replica with max_tokens 1 (its KV is computed and
// held), then to a decode replica, which reads the KV and streams. The
// engines' own histograms then describe two populations — the prefill
// replicas' max_tokens-1 requests and the decode replicas' client
// requests — which the engine column must not sum. PDPhases keeps them
// apart, by the role each engine was given (--engine-url prefill=URL),
// and adds the KV reads between them, from vLLM's vllm:nixl_* metrics and
// the simulator's counters.

// EngineRole is an engine's part in a prefill/decode split.
type EngineRole string

// Engine roles. RoleColocated engines serve whole requests.
const (
	RoleColocated EngineRole = ""
	RolePrefill   EngineRole = "prefill"
	RoleDecode    EngineRole = "decode"
)

// ParseEngineURL reads an --engine-url value: URL, or ROLE=URL with ROLE
// prefill or decode.
func ParseEngineURL(s string) (EngineRole, string, error) {
	role, u, ok := strings.Cut(s, "=")
	if !ok || strings.Contains(role, "/") || strings.Contains(role, ":") {
		return RoleColocated, s, nil
	}
	switch EngineRole(role) {
	case RolePrefill, RoleDecode:
		return EngineRole(role), u, nil
	}
	return RoleColocated, "", fmt.Errorf("engine %q: role %q, want prefill or decode", s, role)
}

// Histograms and counters PDPhases reads (vLLM V1 names; the KV ones are
// NixlConnector's, and the simulator's own where vLLM has none).
const (
	metricQueueTime    = "vllm:request_queue_time_seconds"
	metricPrefillTime  = "vllm:request_prefill_time_seconds"
	metricDecodeTime   = "vllm:request_decode_time_seconds"
	metricE2ETime      = "vllm:e2e_request_latency_seconds"
	metricTTFTTime     = "vllm:time_to_first_token_seconds"
	metricTPOTTime     = "vllm:request_time_per_output_token_seconds"
	metricNIXLXferTime = "vllm:nixl_xfer_time_seconds"
	metricNIXLBytes    = "vllm:nixl_bytes_transferred"
	metricNIXLFailed   = "vllm:nixl_num_failed_transfers_total"
	metricNIXLExpired  = "vllm:nixl_num_kv_expired_reqs_total"
	metricKVRecomputed = "gpurouter_sim_kv_transfer_recomputed_total"
)

// SumCount is a histogram's _sum and _count.
type SumCount struct{ Sum, Count float64 }

// Mean is Sum/Count, NaN when empty.
func (s SumCount) Mean() float64 {
	if s.Count <= 0 {
		return math.NaN()
	}
	return s.Sum / s.Count
}

func (s SumCount) sub(o SumCount) SumCount { return SumCount{s.Sum - o.Sum, s.Count - o.Count} }

// PDUsage is one engine's phase histograms and KV transfer counters over a
// run (between the sampler's first and last reads).
type PDUsage struct {
	Queue, Prefill, Decode, E2E, TTFT, TPOT SumCount
	// Reads are the KV reads this engine made (a decode replica), their
	// time and bytes (Reads.Count = reads).
	Reads, Bytes SumCount
	// Failed reads (vllm:nixl_num_failed_transfers), held requests expired
	// unread (a prefill replica; vLLM's newer
	// vllm:nixl_num_kv_expired_reqs), and requests recomputed after a
	// failed read (the simulator's count).
	Failed, Expired, Recomputed float64
	// NIXL says the engine exposes NixlConnector's metrics.
	NIXL bool
}

func pdUsageOf(s Snapshot) PDUsage {
	hist := func(name string) SumCount {
		h, err := s.Histogram(name, nil)
		if err != nil {
			return SumCount{}
		}
		return SumCount{h.Sum, h.Count}
	}
	u := PDUsage{Queue: hist(metricQueueTime), Prefill: hist(metricPrefillTime), Decode: hist(metricDecodeTime),
		E2E: hist(metricE2ETime), TTFT: hist(metricTTFTTime), TPOT: hist(metricTPOTTime),
		Reads: hist(metricNIXLXferTime), Bytes: hist(metricNIXLBytes)}
	u.Failed, _ = s.sum(metricNIXLFailed)
	u.Expired, _ = s.sum(metricNIXLExpired)
	u.Recomputed, _ = s.sum(metricKVRecomputed)
	_, n := s.sum(metricNIXLFailed)
	u.NIXL = n > 0
	return u
}

func (u PDUsage) sub(o PDUsage) PDUsage {
	return PDUsage{Queue: u.Queue.sub(o.Queue), Prefill: u.Prefill.sub(o.Prefill), Decode: u.Decode.sub(o.Decode),
		E2E: u.E2E.sub(o.E2E), TTFT: u.TTFT.sub(o.TTFT), TPOT: u.TPOT.sub(o.TPOT), Reads: u.Reads.sub(o.Reads),
		Bytes: u.Bytes.sub(o.Bytes), Failed: u.Failed - o.Failed, Expired: u.Expired - o.Expired,
		Recomputed: u.Recomputed - o.Recomputed, NIXL: u.NIXL}
}

// PDGroup is one role's engines summed: each phase's mean over the
// requests they finished.
type PDGroup struct {
	Engines                                 int
	Queue, Prefill, Decode, E2E, TTFT, TPOT SumCount
}

func (g *PDGroup) add(u PDUsage) {
	g.Engines++
	for _, p := range []struct{ to, from *SumCount }{{&g.Queue, &u.Queue}, {&g.Prefill, &u.Prefill},
		{&g.Decode, &u.Decode}, {&g.E2E, &u.E2E}, {&g.TTFT, &u.TTFT}, {&g.TPOT, &u.TPOT}} {
		p.to.Sum += p.from.Sum
		p.to.Count += p.from.Count
	}
}

// PDPhases are a split fleet's phases over a run: the prefill replicas'
// requests (queue, prefill; e2e is both), the KV reads, and the decode
// replicas' requests (queue, which includes the read — vLLM counts a
// request waiting for remote KVs as waiting —, the last prompt token's
// "prefill", decode). Reads, Failed, Expired and Recomputed are summed
// over every engine.
type PDPhases struct {
	Prefill, Decode                      PDGroup
	Reads, Bytes                         SumCount
	Failed, Expired, Recomputed          float64
	PrefillEngines, DecodeEngines        []string
	colocatedEnginesLeftOut, unreadables int
}

// NewPDPhases groups the engines' usage by role; nil when no engine was
// given a role (not a split run).
func NewPDPhases(us []EngineUsage, roles map[string]EngineRole) *PDPhases {
	var p PDPhases
	split := false
	for _, u := range us {
		role := roles[u.URL]
		switch role {
		case RolePrefill:
			split = true
			p.Prefill.add(u.PD)
			p.PrefillEngines = append(p.PrefillEngines, u.URL)
		case RoleDecode:
			split = true
			p.Decode.add(u.PD)
			p.DecodeEngines = append(p.DecodeEngines, u.URL)
		default:
			p.colocatedEnginesLeftOut++
			continue
		}
		p.Reads.Sum, p.Reads.Count = p.Reads.Sum+u.PD.Reads.Sum, p.Reads.Count+u.PD.Reads.Count
		p.Bytes.Sum += u.PD.Bytes.Sum
		p.Failed += u.PD.Failed
		p.Expired += u.PD.Expired
		p.Recomputed += u.PD.Recomputed
		if !u.PD.NIXL {
			p.unreadables++
		}
	}
	if !split {
		return nil
	}
	return &p
}

// WritePDPhases prints p, means in ms.
func WritePDPhases(w io.Writer, p *PDPhases) error {
	c := &consoleWriter{w: w}
	c.line(center(" Prefill/Decode Phases (engines) ", '=', 70))
	c.line(fmt.Sprintf("%-34s %16s %16s", "", fmt.Sprintf("prefill (%d)", p.Prefill.Engines), fmt.Sprintf("decode (%d)", p.Decode.Engines)))
	row := func(label string, a, b SumCount, scale float64) {
		cell := func(s SumCount) string {
			if v := s.Mean(); !math.IsNaN(v) {
				return fmt.Sprintf("%.2f", v*scale)
			}
			return "-"
		}
		c.line(fmt.Sprintf("%-34s %16s %16s", label, cell(a), cell(b)))
	}
	c.line(fmt.Sprintf("%-34s %16.0f %16.0f", "Requests finished:", p.Prefill.E2E.Count, p.Decode.E2E.Count))
	row("Mean queue (ms):", p.Prefill.Queue, p.Decode.Queue, 1000)
	row("Mean prefill (ms):", p.Prefill.Prefill, p.Decode.Prefill, 1000)
	row("Mean decode (ms):", p.Prefill.Decode, p.Decode.Decode, 1000)
	row("Mean TTFT at the engine (ms):", p.Prefill.TTFT, p.Decode.TTFT, 1000)
	row("Mean TPOT at the engine (ms):", SumCount{}, p.Decode.TPOT, 1000)
	row("Mean e2e at the engine (ms):", p.Prefill.E2E, p.Decode.E2E, 1000)
	c.line(fmt.Sprintf("%-34s %16.0f  failed %.0f, recomputed %.0f", "KV reads (decode side):", p.Reads.Count, p.Failed, p.Recomputed))
	if p.Reads.Count > 0 {
		c.line(fmt.Sprintf("%-34s %16.2f  %.2f GB in all", "Mean KV read (ms):", 1000*p.Reads.Mean(), p.Bytes.Sum/1e9))
	}
	c.line(fmt.Sprintf("%-34s %16.0f", "Held KV expired unread (prefill):", p.Expired))
	c.line("Decode queue includes the KV read (vLLM counts a request waiting for remote KVs as waiting);")
	c.line("decode prefill is its last prompt token. Prefill e2e ≈ the TTFT a router adds before the decode.")
	if p.unreadables > 0 {
		c.line(fmt.Sprintf("%d engine(s) expose no vllm:nixl_* metrics: no KV connector, or an older vLLM", p.unreadables))
	}
	if p.colocatedEnginesLeftOut > 0 {
		c.line(fmt.Sprintf("%d engine(s) without a role left out", p.colocatedEnginesLeftOut))
	}
	c.line(strings.Repeat("=", 70))
	return c.err
}

// JSON is the result file's gpurouter_pd_phases: means in ms.
func (p *PDPhases) JSON() map[string]any {
	group := func(g PDGroup) map[string]any {
		return map[string]any{"engines": g.Engines, "requests": g.E2E.Count,
			"mean_queue_ms": msOrNil(g.Queue.Mean()), "mean_prefill_ms": msOrNil(g.Prefill.Mean()),
			"mean_decode_ms": msOrNil(g.Decode.Mean()), "mean_ttft_ms": msOrNil(g.TTFT.Mean()),
			"mean_tpot_ms": msOrNil(g.TPOT.Mean()), "mean_e2e_ms": msOrNil(g.E2E.Mean())}
	}
	return map[string]any{"prefill": group(p.Prefill), "decode": group(p.Decode),
		"prefill_engines": p.PrefillEngines, "decode_engines": p.DecodeEngines,
		"kv_reads": p.Reads.Count, "mean_kv_read_ms": msOrNil(p.Reads.Mean()), "kv_bytes": p.Bytes.Sum,
		"kv_failed_reads": p.Failed, "kv_recomputed": p.Recomputed, "kv_expired": p.Expired}
}
