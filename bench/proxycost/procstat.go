package proxycost

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// clockTick is Linux's USER_HZ, the unit of /proc's CPU times: 100 on
// every architecture Go supports (the kernel fixes it for user space).
const clockTick = 10 * time.Millisecond

// procCPU is a process's CPU time, user plus system, from /proc/PID/stat
// (all its threads; children it has reaped are not included).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// parseStatCPU reads utime and stime (fields 14 and 15) from a
// /proc/PID/stat line. The command name (field 2) may hold spaces and
// parentheses, so fields are counted from its closing parenthesis.
func parseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("proxycost: malformed /proc/PID/stat")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state): utime is field 14, f[11].
	if len(f) < 13 {
		return 0, errors.New("proxycost: short /proc/PID/stat")
	}
	u, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	s, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("proxycost: /proc/PID/stat: %w", err)
	}
	return time.Duration(u+s) * clockTick, nil
}

// procRSS is a process's resident set size in bytes (VmRSS in
// /proc/PID/status).
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseRSS(b)
}

func parseRSS(b []byte) (int64, error) {
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("VmRSS:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) < 1 {
			break
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("proxycost: VmRSS: %w", err)
		}
		return kb << 10, nil
	}
	return 0, errors.New("proxycost: no VmRSS in /proc/PID/status")
}

// boxBusy is the CPU time every core of the machine spent on anything but
// idling, from the first line of /proc/stat: user, nice, system, irq,
// softirq and steal (guest time is already inside user).
func boxBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseBoxBusy(b)
}

func parseBoxBusy(b []byte) (time.Duration, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, errors.New("proxycost: malformed /proc/stat")
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system [idle iowait] irq softirq steal
		v, err := strconv.ParseInt(string(f[i]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("proxycost: /proc/stat: %w", err)
		}
		busy += v
	}
	return time.Duration(busy) * clockTick, nil
}

// cpuMeter measures, over one run, the CPU time of the proxy's processes
// and of everything else on the box, which is what the quiet-box filter
// judges: /proc/stat's busy time less the harness's and the proxy's
// (boxOthers). The other processes' own utime+stime, read one by one from
// /proc (others), is kept beside it, to tell a busy neighbour from the
// interrupt work of the run's own traffic, which the kernel may charge to
// whatever ran when it came.
type cpuMeter struct {
	pids        []int // the proxy's processes; none for direct
	proxy0      time.Duration
	others0     map[int]time.Duration
	self0, box0 time.Duration
}

func startCPU(pids []int) (*cpuMeter, error) {
	m := &cpuMeter{pids: pids}
	var err error
	if m.proxy0, err = sumCPU(pids); err != nil {
		return nil, err
	}
	if m.others0, err = otherCPU(m.excluded()); err != nil {
		return nil, err
	}
	if m.self0, err = procCPU(os.Getpid()); err != nil {
		return nil, err
	}
	if m.box0, err = boxBusy(); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *cpuMeter) excluded() map[int]bool {
	ex := map[int]bool{os.Getpid(): true}
	for _, p := range m.pids {
		ex[p] = true
	}
	return ex
}

// stop returns the proxy's CPU time over the run, the other processes'
// (one by one), and the machine's busy time less the harness's and the
// proxy's.
func (m *cpuMeter) stop() (proxy, others, boxOthers time.Duration, err error) {
	p, err := sumCPU(m.pids)
	if err != nil {
		return 0, 0, 0, err
	}
	now, err := otherCPU(m.excluded())
	if err != nil {
		return 0, 0, 0, err
	}
	self, err := procCPU(os.Getpid())
	if err != nil {
		return 0, 0, 0, err
	}
	box, err := boxBusy()
	if err != nil {
		return 0, 0, 0, err
	}
	for pid, t := range now {
		others += max(t-m.others0[pid], 0) // a process born in the run counts whole
	}
	proxy = p - m.proxy0
	boxOthers = max((box-m.box0)-proxy-(self-m.self0), 0)
	return proxy, others, boxOthers, nil
}

// otherCPU is every process's CPU time (utime+stime) but the excluded
// ones', by pid. A process that vanished between two reads is skipped;
// children's times reaped by a parent are left out (a test binary's whole
// life would land in one run when go test reaps it).
func otherCPU(exclude map[int]bool) (map[int]time.Duration, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := make(map[int]time.Duration, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || exclude[pid] {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if t, err := parseStatCPU(b); err == nil {
			out[pid] = t
		}
	}
	return out, nil
}

func sumCPU(pids []int) (time.Duration, error) {
	var t time.Duration
	for _, pid := range pids {
		d, err := procCPU(pid)
		if err != nil {
			return 0, err
		}
		t += d
	}
	return t, nil
}
