package sim

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// kvMetrics are a NixlConnector replica's KV transfer series. vLLM's own
// (NixlPromMetrics in nixl_connector.py; vllm:nixl_num_kv_expired_reqs in
// the newer kv_connector/v1/nixl/stats.py) carry model_name and engine
// (counters declared without _total in Python, exposed with it) and are
// recorded where vLLM records them: a read's time, bytes and
// descriptors, and failed reads, on the decode replica that read; expired
// requests on the prefill replica that held them.
// vllm:nixl_num_failed_notifications stays 0: the simulator's
// "notification" is the read's own completion. The gpurouter_sim_kv_*
// series are the simulator's own, named so that nobody takes them for
// vLLM's. A nil *kvMetrics records nothing.
type kvMetrics struct {
	xferTime, postTime, bytes, descriptors prometheus.Observer
	failedTransfers, failedNotifications   prometheus.Counter
	expiredReqs                            prometheus.Counter

	pulls      *prometheus.CounterVec // by outcome
	bytesIn    prometheus.Counter
	bytesOut   prometheus.Counter
	sent       prometheus.Counter
	expired    prometheus.Counter
	recomputed prometheus.Counter
	held       prometheus.Gauge
	heldBlocks prometheus.Gauge
}

// Outcomes of a read, the outcome label of gpurouter_sim_kv_transfer_pulls_total.
const (
	pullOK            = "ok"             // the blocks arrived
	pullRefused       = "refused"        // the prefill replica answered an error (unknown request, blocks or engine id; a failed transfer)
	pullConnect       = "connect_error"  // no connection to the side channel (the prefill replica is down)
	pullReset         = "reset"          // the connection broke mid-read (the prefill replica died)
	pullTimeout       = "timeout"        // no answer within the pull timeout (a stalled prefill replica)
	pullInvalidParams = "invalid_params" // kv_transfer_params lacked what a read needs: no read was made
)

func newKVMetrics(f promauto.Factory, labels []string, lv []string) *kvMetrics {
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		return f.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels).
			WithLabelValues(lv...)
	}
	counter := func(name, help string) prometheus.Counter {
		return f.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels).WithLabelValues(lv...)
	}
	// uniform 2 KiB to 8 GiB, as vLLM's [2 ** (10 + i) for i in range(1, 25, 2)]
	var byteBuckets []float64
	for i := 1; i < 25; i += 2 {
		byteBuckets = append(byteBuckets, float64(uint64(1)<<(10+i)))
	}
	m := &kvMetrics{
		xferTime: hist("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.",
			[]float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0}),
		postTime: hist("vllm:nixl_post_time_seconds", "Histogram of transfer post time for NIXL KV Cache transfers.",
			[]float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0}),
		bytes: hist("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.", byteBuckets),
		descriptors: hist("vllm:nixl_num_descriptors", "Histogram of number of descriptors per NIXL  KV Cache transfers.",
			[]float64{10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000}),
		failedTransfers:     counter("vllm:nixl_num_failed_transfers_total", "Number of failed NIXL KV Cache transfers."),
		failedNotifications: counter("vllm:nixl_num_failed_notifications_total", "Number of failed NIXL KV Cache notifications."),
		expiredReqs: counter("vllm:nixl_num_kv_expired_reqs_total",
			"Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance."),
		pulls: f.NewCounterVec(prometheus.CounterOpts{Name: "gpurouter_sim_kv_transfer_pulls_total",
			Help: "KV reads this (decode) replica made from a prefill replica's side channel, by outcome: ok, refused, " +
				"connect_error, reset, timeout, invalid_params (no read made). The simulator's own."}, []string{"outcome"}),
		bytesIn: f.NewCounter(prometheus.CounterOpts{Name: "gpurouter_sim_kv_transfer_received_bytes_total",
			Help: "KV bytes this replica read from prefill replicas. The simulator's own."}),
		bytesOut: f.NewCounter(prometheus.CounterOpts{Name: "gpurouter_sim_kv_transfer_sent_bytes_total",
			Help: "KV bytes decode replicas read from this replica. The simulator's own."}),
		sent: f.NewCounter(prometheus.CounterOpts{Name: "gpurouter_sim_kv_transfer_sent_total",
			Help: "Reads of this replica's held KV blocks served to the end (the blocks were then freed). The simulator's own."}),
		expired: f.NewCounter(prometheus.CounterOpts{Name: "gpurouter_sim_kv_transfer_expired_total",
			Help: "Requests whose held KV blocks nobody read within the abort timeout (then freed). The simulator's own."}),
		recomputed: f.NewCounter(prometheus.CounterOpts{Name: "gpurouter_sim_kv_transfer_recomputed_total",
			Help: "Decode requests whose read failed and whose prompt this replica computed itself " +
				"(kv_load_failure_policy recompute). The simulator's own."}),
		held: f.NewGauge(prometheus.GaugeOpts{Name: "gpurouter_sim_kv_transfer_held_requests",
			Help: "Finished prefill requests whose KV blocks this replica holds for a decode replica to read. The simulator's own."}),
		heldBlocks: f.NewGauge(prometheus.GaugeOpts{Name: "gpurouter_sim_kv_transfer_held_blocks",
			Help: "KV blocks held for decode replicas to read (they count in the KV cache usage). The simulator's own."}),
	}
	for _, o := range []string{pullOK, pullRefused, pullConnect, pullReset, pullTimeout, pullInvalidParams} {
		m.pulls.WithLabelValues(o)
	}
	return m
}

// read records one read's end on the decode side.
func (m *kvMetrics) read(outcome string, post, total time.Duration, bytes float64, descriptors int) {
	if m == nil {
		return
	}
	m.pulls.WithLabelValues(outcome).Inc()
	switch outcome {
	case pullOK:
		m.xferTime.Observe(total.Seconds())
		m.postTime.Observe(post.Seconds())
		m.bytes.Observe(bytes)
		m.descriptors.Observe(float64(descriptors))
		m.bytesIn.Add(bytes)
	case pullInvalidParams:
	default:
		m.failedTransfers.Inc()
	}
}
