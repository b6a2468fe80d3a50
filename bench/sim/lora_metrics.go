package sim

import (
	"math"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// loraInfoSeries bounds how many vllm:lora_requests_info series a replica
// exposes. vLLM keeps every label set it ever set (prometheus_client never
// forgets one), so its family grows for the life of the process; the
// simulator drops the oldest beyond this many so that a long run's
// /metrics stays small. Readers take the newest series either way.
const loraInfoSeries = 64

// loraMetrics are a replica's LoRA series: vLLM's vllm:lora_requests_info,
// a gauge whose value is the time it was last set and whose labels carry
// the state (max_lora, running_lora_adapters, waiting_lora_adapters; no
// model_name or engine, as vLLM), and the simulator's own swap counters,
// which vLLM has no equivalent of. A nil *loraMetrics records nothing.
type loraMetrics struct {
	info    *prometheus.GaugeVec
	maxLoRA string

	cur    prometheus.Gauge // the series of the current labels
	curKey [2]string        // its running and waiting labels
	last   float64          // the value set last
	recent [][2]string      // label sets exposed, least recently current first

	swaps, swapSeconds [2]prometheus.Counter // by source
}

func newLoRAMetrics(f promauto.Factory, maxLoRAs int) *loraMetrics {
	m := &loraMetrics{
		info: f.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:lora_requests_info", Help: "Running stats on lora requests."},
			[]string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}),
		maxLoRA: strconv.Itoa(maxLoRAs),
	}
	swaps := f.NewCounterVec(prometheus.CounterOpts{Name: "gpurouter_sim_lora_swaps_total",
		Help: "LoRA adapters brought into a GPU slot, by where from: the CPU cache (a copy over PCIe) or disk " +
			"(a load, then the copy). The simulator's own: vLLM exports no such count."}, []string{"source"})
	secs := f.NewCounterVec(prometheus.CounterOpts{Name: "gpurouter_sim_lora_swap_seconds_total",
		Help: "Engine time spent bringing LoRA adapters into GPU slots, by where from (see gpurouter_sim_lora_swaps_total)."},
		[]string{"source"})
	for src, name := range []string{swapFromCPU: "cpu", swapFromDisk: "disk"} {
		m.swaps[src] = swaps.WithLabelValues(name)
		m.swapSeconds[src] = secs.WithLabelValues(name)
	}
	return m
}

// swapped counts one swap.
func (m *loraMetrics) swapped(src int, d time.Duration) {
	if m == nil {
		return
	}
	m.swaps[src].Inc()
	m.swapSeconds[src].Add(d.Seconds())
}

// relabel makes the series of these labels the current one, creating it
// (and dropping the least recently current beyond loraInfoSeries) if
// needed.
func (m *loraMetrics) relabel(running, waiting string) {
	key := [2]string{running, waiting}
	if m.cur != nil && key == m.curKey {
		return
	}
	m.cur, m.curKey = m.info.WithLabelValues(m.maxLoRA, running, waiting), key
	for i, k := range m.recent {
		if k == key {
			m.recent = append(m.recent[:i], m.recent[i+1:]...)
			break
		}
	}
	m.recent = append(m.recent, key)
	if len(m.recent) > loraInfoSeries {
		old := m.recent[0]
		m.info.DeleteLabelValues(m.maxLoRA, old[0], old[1])
		m.recent = m.recent[1:]
	}
	// The newest series must read newest even when two label sets are set
	// within one clock tick: readers tell them apart by value alone.
	m.last = math.Nextafter(m.last, math.Inf(1))
}

// stamp sets the current series to now (Unix seconds), never below a
// value set before.
func (m *loraMetrics) stamp(now time.Time) {
	m.last = max(float64(now.UnixNano())/1e9, m.last)
	m.cur.Set(m.last)
}
