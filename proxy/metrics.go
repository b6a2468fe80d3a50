package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// vLLM's histogram boundaries (vllm/v1/metrics/loggers.py), so router and
// engine histograms compare bucket by bucket.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets  = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	// Connect times are far below vLLM's request scales; these resolve
	// loopback (sub-ms) up to a slow cross-zone handshake.
	connectBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
)

// metrics are the router's own Prometheus series. Per-replica children are
// resolved once per replica (replicaMetrics) so the hot path only observes.
type metrics struct {
	requests   *prometheus.CounterVec // model, replica, status, outcome
	retries    *prometheus.CounterVec // model, reason
	ttft       *prometheus.HistogramVec
	itl        *prometheus.HistogramVec
	tpot       *prometheus.HistogramVec
	e2e        *prometheus.HistogramVec
	queue      *prometheus.HistogramVec // model
	connect    *prometheus.HistogramVec // replica
	stale      *prometheus.CounterVec   // replica
	promptToks *prometheus.CounterVec
	genToks    *prometheus.CounterVec
	mig        *migrationMetrics      // migrate_metrics.go
	pd         *pdMetrics             // disagg_record.go
	loopIn     prometheus.Counter     // streams taken into the stream loop (pump_linux.go)
	loopOut    *prometheus.CounterVec // reason
	// loopHandOffs counts client connections a request loop gave to
	// fasthttp's server (reqloop_linux.go).
	loopHandOffs prometheus.Counter
	// refused counts the requests the front door refused (frontdoor.go),
	// by the status answered.
	refused *prometheus.CounterVec
	// The loops' socket reads and writes made in io_uring batches: a
	// stream's (pump_batch_linux.go), and a request's or its answer's
	// (reqloop_batch_linux.go).
	streamReads, streamWrites, requestReads, requestWrites prometheus.Counter
	// rawAnswers counts the whole answers a request loop relayed from the
	// engine's bytes (reqloop_answer_linux.go), parsedAnswers the rest.
	rawAnswers, parsedAnswers prometheus.Counter
	// loraLoads counts the LoRA adapter loads the router asked of
	// engines, and those it did not ask for in a failed load's backoff
	// (lora_load.go), by model and result.
	loraLoads *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	lr := []string{"model", "replica", "arm"}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_requests_total",
			Help: "Requests finished, by model, replica (the last one the request was sent to; \"\" if none), A/B arm (the policy name outside experiments), HTTP status and outcome.",
		}, []string{"model", "replica", "arm", "status", "outcome"}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_upstream_stale_connections_total",
			Help: "Requests resent on another connection to the same replica because the pooled keep-alive connection they went out on had been closed by the engine (no attempt, no failure).",
		}, []string{"replica"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_retries_total",
			Help: "Attempts retried on another replica before any byte reached the client, by reason.",
		}, []string{"model", "reason"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpurouter_time_to_first_token_seconds",
			Help:    "Router-side TTFT: request fully received to first token chunk relayed.",
			Buckets: ttftBuckets,
		}, lr),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpurouter_inter_token_latency_seconds",
			Help:    "Router-side gap between consecutive token chunks.",
			Buckets: itlBuckets,
		}, lr),
		tpot: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpurouter_request_time_per_output_token_seconds",
			Help:    "Router-side (e2e - TTFT) / (output tokens - 1), per request with more than one output token.",
			Buckets: itlBuckets,
		}, lr),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpurouter_e2e_request_latency_seconds",
			Help:    "Router-side end-to-end latency: request fully received to last token chunk (or response end).",
			Buckets: e2eBuckets,
		}, lr),
		queue: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpurouter_request_queue_time_seconds",
			Help:    "Time a request spent in the router before being sent upstream (admission wait, picking, retries).",
			Buckets: e2eBuckets,
		}, []string{"model"}),
		connect: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpurouter_upstream_connect_seconds",
			Help:    "TCP connect time to a replica, per new connection.",
			Buckets: connectBuckets,
		}, []string{"replica"}),
		promptToks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_prompt_tokens_total",
			Help: "Prompt tokens of finished requests, as the engine reported them in usage.",
		}, lr),
		genToks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_generation_tokens_total",
			Help: "Generated tokens of finished requests, as the engine reported them in usage.",
		}, lr),
		loopIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpurouter_stream_loop_streams_total",
			Help: "Streams relayed in a loop (Linux; upstream.goroutine_streams false) once their head was out: a request loop's, or a stream loop's for those served on fasthttp's path. Minus the exits: the streams in loops now.",
		}),
		loopOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_stream_loop_exits_total",
			Help: "Streams leaving a loop, by reason: end (the engine's response ended; a request loop's stream ends there, any other on a goroutine), upstream_error (reset, broken framing), timeout (first byte or idle), slow_client (its socket took less than an event), client_gone (a write failed), aborted (the client left, shutdown or the total deadline), leaving (its replica is leaving its pool: the stream moves), stopped (the loop stopped).",
		}, []string{"reason"}),
		loopHandOffs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpurouter_request_loop_handoffs_total",
			Help: "Client connections a request loop (upstream.request_loops) gave to the goroutine path with a request it does not serve: the router's own endpoints, HTTP/1.0, a chunked body, Expect, a body over the limit, a request that may go to a pool behind TLS, that splits its long prompts or that tokenizes them for its prefix index. The connection stays there.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurouter_requests_refused_total",
			Help: "Requests refused before anything acted on them, by the HTTP status answered: 400 not HTTP/1.1 by RFC 9112's grammar or framed ambiguously (both Content-Length and Transfer-Encoding, a malformed length, a lone CR or LF, a folded line, a field name not a token, a control character), 431 a head over its size or field-count bound, 501 an unknown transfer coding, 505 another HTTP version, 408 a request not sent in time, 413 a chunked body over the limit. Each connection is closed.",
		}, []string{"status"}),
	}
	batched := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpurouter_loop_batched_io_total",
		Help: "Reads and writes of the loops' sockets (Linux) made in io_uring batches, a wake-up's in one io_uring_enter, by op (read, write) and what they carry (stream: a stream's events; request: a request, or a whole answer); none where the kernel refuses io_uring or upstream.unbatched_io is set.",
	}, []string{"op", "of"})
	m.streamReads, m.streamWrites = batched.WithLabelValues("read", "stream"), batched.WithLabelValues("write", "stream")
	m.requestReads, m.requestWrites = batched.WithLabelValues("read", "request"), batched.WithLabelValues("write", "request")
	answers := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpurouter_request_loop_answers_total",
		Help: "Whole answers a request loop wrote, by how: bytes (relayed from the engine's, a plain 200 to an HTTP/1.1 client) or parsed (through fasthttp's response).",
	}, []string{"how"})
	m.rawAnswers, m.parsedAnswers = answers.WithLabelValues("bytes"), answers.WithLabelValues("parsed")
	m.loraLoads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpurouter_lora_loads_total",
		Help: "LoRA adapters loaded on demand on a replica (lora.load_on_demand), by pool model and result: loaded, already_loaded (the engine had it), failed, backoff (not asked: a failed load there is in its backoff).",
	}, []string{"model", "result"})
	for _, c := range []prometheus.Collector{m.requests, m.retries, m.stale, m.ttft, m.itl, m.tpot, m.e2e, m.queue, m.connect, m.promptToks, m.genToks, m.loopIn, m.loopOut, m.loopHandOffs, m.refused, batched, answers, m.loraLoads} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	var err error
	if m.mig, err = newMigrationMetrics(reg); err != nil {
		return nil, err
	}
	m.pd, err = newPDMetrics(reg)
	return m, err
}

// replicaMetrics are one (replica, arm)'s pre-resolved children.
type replicaMetrics struct {
	arm                  string
	ttft, itl, tpot, e2e prometheus.Observer
	promptToks, genToks  prometheus.Counter
	// ok counts the requests served with a 200, the usual end: resolved
	// here, it spares each request five label lookups (other ends look
	// theirs up when they happen).
	ok prometheus.Counter
}

func (m *metrics) forReplica(model, replica, arm string) *replicaMetrics {
	return &replicaMetrics{
		arm:        arm,
		ok:         m.requests.WithLabelValues(model, replica, arm, "200", outcomeOK.String()),
		ttft:       m.ttft.WithLabelValues(model, replica, arm),
		itl:        m.itl.WithLabelValues(model, replica, arm),
		tpot:       m.tpot.WithLabelValues(model, replica, arm),
		e2e:        m.e2e.WithLabelValues(model, replica, arm),
		promptToks: m.promptToks.WithLabelValues(model, replica, arm),
		genToks:    m.genToks.WithLabelValues(model, replica, arm),
	}
}
