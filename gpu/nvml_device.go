//go:build cgo

package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// read returns the device's current stats. Utilisation and memory are the
// core readings: a failure there is an error (a lost GPU says
// ERROR_GPU_IS_LOST). Everything else is best-effort: a reading the GPU does
// not support (power on some boards, ECC on consumer cards) stays zero.
func (d *nvmlDevice) read() (GPUStats, error) {
	st := GPUStats{
		Index:         d.index,
		UUID:          d.uuid,
		Name:          d.name,
		SMClockMaxMHz: d.maxSMMHz,
		XidErrors:     d.xid,
	}
	u, ret := d.h.GetUtilizationRates()
	if ret != nvml.SUCCESS {
		return st, d.fail("utilization", ret)
	}
	st.UtilizationPct = float64(u.Gpu)
	if st.MemoryUsedBytes, st.MemoryTotalBytes, ret = d.memory(); ret != nvml.SUCCESS {
		return st, d.fail("memory", ret)
	}
	if mw, ret := d.h.GetPowerUsage(); ret == nvml.SUCCESS {
		st.PowerWatts = float64(mw) / 1000
	}
	if mw, ret := d.h.GetEnforcedPowerLimit(); ret == nvml.SUCCESS {
		st.PowerLimitWatts = float64(mw) / 1000
	}
	if t, ret := d.h.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		st.TemperatureC = float64(t)
	}
	if c, ret := d.h.GetClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
		st.SMClockMHz = c
	}
	var reasons uint64
	ret = nvml.ERROR_FUNCTION_NOT_FOUND
	if !d.throttleV1 {
		reasons, ret = d.h.GetCurrentClocksEventReasons()
	}
	if ret == nvml.ERROR_FUNCTION_NOT_FOUND || ret == nvml.ERROR_NOT_SUPPORTED {
		reasons, ret = d.h.GetCurrentClocksThrottleReasons() // drivers before 535
	}
	if ret == nvml.SUCCESS {
		st.ThrottleReasons = slowdownReasons(reasons)
	}
	if e, ret := d.h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
		st.ECCUncorrected = e
	}
	return st, nil
}

// memory reads framebuffer use as nvidia-smi and the DCGM exporter report it.
// The v1 call counts the driver's own reservation as used (615 MiB on an
// idle H200 with driver 580, where nvidia-smi says 0), so the same GPU read
// through the agent and through DCGM would disagree; v2 reports the
// reservation apart. Drivers before 510 lack v2 (memV1, from the library's
// symbols); a device that refuses it stays on v1 as well.
func (d *nvmlDevice) memory() (used, total uint64, ret nvml.Return) {
	if !d.memV1 {
		m, ret := d.h.GetMemoryInfo_v2()
		switch ret {
		case nvml.SUCCESS:
			return m.Used, m.Total, ret
		case nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_ARGUMENT_VERSION_MISMATCH:
			d.memV1 = true
		default:
			return 0, 0, ret
		}
	}
	m, ret := d.h.GetMemoryInfo()
	return m.Used, m.Total, ret
}

func (d *nvmlDevice) fail(what string, ret nvml.Return) error {
	return fmt.Errorf("gpu: NVML GPU %d (%s) %s: %w", d.index, d.uuid, what, ret)
}

// slowdownReasons names the clock-event reasons in mask that lower the SM
// clock below what the workload asks for (SlowdownReasonNames, in its
// order). Idle, application-clock and display-clock settings are reasons
// too but not slowdowns, and are left out, so a non-empty list means "this
// GPU is being held back". nil when none.
func slowdownReasons(mask uint64) []string {
	bits := [...]uint64{ // SlowdownReasonNames', in its order
		nvml.ClocksEventReasonSwPowerCap,
		nvml.ClocksThrottleReasonHwSlowdown,
		nvml.ClocksEventReasonSyncBoost,
		nvml.ClocksEventReasonSwThermalSlowdown,
		nvml.ClocksThrottleReasonHwThermalSlowdown,
		nvml.ClocksThrottleReasonHwPowerBrakeSlowdown,
	}
	var out []string
	for i, name := range SlowdownReasonNames() {
		if mask&bits[i] != 0 {
			out = append(out, name)
		}
	}
	return out
}
