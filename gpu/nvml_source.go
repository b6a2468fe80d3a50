package gpu

import "context"

// What NVML's sessions share with or without cgo (nvml.go reads the
// driver through go-nvml, which needs cgo; nvml_off.go stands in for it
// where there is none, as a host without the driver's library).

// offNoLibrary is the log line and error words of a session that found
// no driver library.
const offNoLibrary = "libnvidia-ml.so.1 not found"

// applicationXid reports Xids caused by the application rather than the GPU
// (the same skip list as NVIDIA's Kubernetes device plugin): 13 graphics
// engine exception, 31 memory page fault, 43 channel stopped, 45 preemptive
// cleanup, 68 video processor exception, 109 context switch timeout.
func applicationXid(xid uint64) bool {
	switch xid {
	case 13, 31, 43, 45, 68, 109:
		return true
	}
	return false
}

// SlowdownReasonNames lists every name that GPUStats.ThrottleReasons may
// hold for an NVML GPU, in a fixed order (the agent exports one series each).
func SlowdownReasonNames() []string {
	return []string{"sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
}

// NVMLSource is the Source of GPUs on this host, read through a shared NVML
// session. Build with NewNVMLSource; the zero value is unusable.
type NVMLSource struct {
	n   *NVML
	sel Selector
}

// NewNVMLSource binds sel (local indexes or UUIDs; the zero Selector for all
// GPUs) to the session n. It calls nothing in NVML.
func NewNVMLSource(n *NVML, sel Selector) *NVMLSource {
	return &NVMLSource{n: n, sel: sel}
}

// Fetch reads the selected GPUs. NVML calls are local and not cancellable;
// ctx is checked only before starting.
func (s *NVMLSource) Fetch(ctx context.Context) ([]GPUStats, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.n.Read(s.sel)
}
