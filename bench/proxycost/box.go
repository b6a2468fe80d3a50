package proxycost

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// The paths describeBox reads; a file missing leaves its part out.
const (
	cpuinfoPath     = "/proc/cpuinfo"
	osreleasePath   = "/proc/sys/kernel/osrelease"
	cpuidlePath     = "/sys/devices/system/cpu/cpuidle/current_driver"
	haltPollMaxPath = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"
)

// describeBox says what the run's figures depend on beyond the proxies:
// CPU model and count, kernel, Go, and how an idle CPU waits for work.
// The last decides the c=1 row more than any proxy does: at c=1 every
// proxy's CPU goes idle twice a request, and on a VM whose idle vCPUs halt
// (the haltpoll driver with guest halt polling off, say) each wake-up is a
// trip through the hypervisor. On the 2 vCPU AMD EPYC VM of 2026-12-06
// every proxy added 108–149 µs at c=1 with polling off, which hid the
// proxies' own work, and 24–61 µs with it on (guest_halt_poll_ns 200000),
// where the router's own work showed (docs/performance-log.md). read is
// os.ReadFile outside tests.
func describeBox(read func(string) ([]byte, error)) string {
	model, vm := "unknown CPU", false
	if b, err := read(cpuinfoPath); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "model name":
				if model == "unknown CPU" {
					model = strings.TrimSpace(v)
				}
			case "flags":
				vm = vm || slices.Contains(strings.Fields(v), "hypervisor")
			}
		}
	}
	s := fmt.Sprintf("%d× %s", runtime.NumCPU(), model)
	if b, err := read(osreleasePath); err == nil {
		s += ", Linux " + strings.TrimSpace(string(b))
	}
	s += ", " + runtime.Version()
	if idle := idleWait(read); idle != "" || vm {
		var parts []string
		if vm {
			parts = append(parts, "a VM")
		}
		if idle != "" {
			parts = append(parts, idle)
		}
		s += "; " + strings.Join(parts, ", ")
	}
	return s
}

// idleWait is how an idle CPU waits: the cpuidle driver, and for
// haltpoll how long a vCPU polls before it halts. "" when the kernel
// does not say.
func idleWait(read func(string) ([]byte, error)) string {
	b, err := read(cpuidlePath)
	if err != nil {
		return ""
	}
	driver := strings.TrimSpace(string(b))
	if driver == "" || driver == "none" {
		return "no cpuidle driver"
	}
	s := "cpuidle " + driver
	if driver != "haltpoll" {
		return s
	}
	b, err = read(haltPollMaxPath)
	if err != nil {
		return s
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	switch {
	case err != nil:
		return s
	case ns <= 0:
		return s + ", guest halt polling off: an idle vCPU halts at once"
	default:
		return s + fmt.Sprintf(", guest halt polling: an idle vCPU polls up to %d µs before it halts", ns/1000)
	}
}

// machine describes this box (describeBox).
func machine() string { return describeBox(os.ReadFile) }
