package gpu

import (
	"context"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// gpuCollector exports GPUStats as gpurouter_gpu_* series, reading the
// source at scrape time (no ticker, no stored state). Base units: ratios,
// bytes, watts, degrees Celsius, hertz.
type gpuCollector struct {
	read func(context.Context) ([]GPUStats, bool, error)

	enabled, up, info             *prometheus.Desc
	util, memUsed, memTotal       *prometheus.Desc
	power, powerLimit, temp       *prometheus.Desc
	smClock, smClockMax, slowdown *prometheus.Desc
	xid, ecc                      *prometheus.Desc
}

func newGPUCollector(read func(context.Context) ([]GPUStats, bool, error)) *gpuCollector {
	l := []string{"uuid", "index"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &gpuCollector{
		read:       read,
		enabled:    d("gpurouter_gpu_telemetry_enabled", "1 when this host's GPUs could be read (NVML present), 0 when GPU telemetry is off.", nil),
		up:         d("gpurouter_gpu_read_ok", "1 when the last read of this host's GPUs succeeded.", nil),
		info:       d("gpurouter_gpu_info", "GPU identity; value 1.", []string{"uuid", "index", "name"}),
		util:       d("gpurouter_gpu_utilization_ratio", "Fraction of the last sample period in which a kernel ran (NVML utilization.gpu / 100).", l),
		memUsed:    d("gpurouter_gpu_memory_used_bytes", "Framebuffer memory in use.", l),
		memTotal:   d("gpurouter_gpu_memory_total_bytes", "Framebuffer memory installed.", l),
		power:      d("gpurouter_gpu_power_watts", "Power draw.", l),
		powerLimit: d("gpurouter_gpu_power_limit_watts", "Enforced power limit.", l),
		temp:       d("gpurouter_gpu_temperature_celsius", "GPU core temperature.", l),
		smClock:    d("gpurouter_gpu_sm_clock_hertz", "Current SM clock.", l),
		smClockMax: d("gpurouter_gpu_sm_clock_max_hertz", "Maximum SM clock.", l),
		slowdown:   d("gpurouter_gpu_clock_slowdown", "1 while the named reason holds the SM clock down.", []string{"uuid", "index", "reason"}),
		xid:        d("gpurouter_gpu_xid_errors_total", "Critical Xid errors seen since the agent started (application-caused Xids excluded).", l),
		ecc:        d("gpurouter_gpu_ecc_uncorrected_errors_total", "Volatile uncorrected ECC errors since the driver loaded.", l),
	}
}

func (c *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.enabled, c.up, c.info, c.util, c.memUsed, c.memTotal, c.power,
		c.powerLimit, c.temp, c.smClock, c.smClockMax, c.slowdown, c.xid, c.ecc} {
		ch <- d
	}
}

func (c *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	gpus, on, err := c.read(context.Background())
	ch <- prometheus.MustNewConstMetric(c.enabled, prometheus.GaugeValue, bool01(on))
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, bool01(err == nil))
	reasons := SlowdownReasonNames()
	for _, g := range gpus {
		idx := strconv.Itoa(g.Index)
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, g.UUID, idx)
		}
		ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1, g.UUID, idx, g.Name)
		gauge(c.util, g.UtilizationPct/100)
		gauge(c.memUsed, float64(g.MemoryUsedBytes))
		gauge(c.memTotal, float64(g.MemoryTotalBytes))
		gauge(c.power, g.PowerWatts)
		gauge(c.powerLimit, g.PowerLimitWatts)
		gauge(c.temp, g.TemperatureC)
		gauge(c.smClock, float64(g.SMClockMHz)*1e6)
		gauge(c.smClockMax, float64(g.SMClockMaxMHz)*1e6)
		for _, r := range reasons {
			ch <- prometheus.MustNewConstMetric(c.slowdown, prometheus.GaugeValue,
				bool01(slices.Contains(g.ThrottleReasons, r)), g.UUID, idx, r)
		}
		ch <- prometheus.MustNewConstMetric(c.xid, prometheus.CounterValue, float64(g.XidErrors), g.UUID, idx)
		ch <- prometheus.MustNewConstMetric(c.ecc, prometheus.CounterValue, float64(g.ECCUncorrected), g.UUID, idx)
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
