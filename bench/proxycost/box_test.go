package proxycost

import (
	"io/fs"
	"runtime"
	"strings"
	"testing"
)

// files is a reader of fixed files: a path not in it does not exist.
func files(m map[string]string) func(string) ([]byte, error) {
	return func(p string) ([]byte, error) {
		if s, ok := m[p]; ok {
			return []byte(s), nil
		}
		return nil, fs.ErrNotExist
	}
}

func TestDescribeBoxSaysHowAnIdleCPUWaits(t *testing.T) {
	const cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 hypervisor avx2\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\n"
	head := runtime.Version()
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string // what follows "2× AMD EPYC, Linux 6.18.44, go1.x"
	}{
		{"haltpoll, polling off", map[string]string{cpuidlePath: "haltpoll\n", haltPollMaxPath: "0\n"},
			"; a VM, cpuidle haltpoll, guest halt polling off: an idle vCPU halts at once"},
		{"haltpoll, polling on", map[string]string{cpuidlePath: "haltpoll\n", haltPollMaxPath: "200000\n"},
			"; a VM, cpuidle haltpoll, guest halt polling: an idle vCPU polls up to 200 µs before it halts"},
		{"haltpoll, no parameters", map[string]string{cpuidlePath: "haltpoll\n"}, "; a VM, cpuidle haltpoll"},
		{"another driver", map[string]string{cpuidlePath: "intel_idle\n", haltPollMaxPath: "0\n"}, "; a VM, cpuidle intel_idle"},
		{"no driver", map[string]string{cpuidlePath: "none\n"}, "; a VM, no cpuidle driver"},
		{"nothing said", map[string]string{}, "; a VM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{cpuinfoPath: cpuinfo, osreleasePath: "6.18.44\n"}
			for k, v := range tc.files {
				m[k] = v
			}
			got := describeBox(files(m))
			want := "AMD EPYC, Linux 6.18.44, " + head + tc.want
			if !strings.HasSuffix(got, "× "+want) {
				t.Errorf("describeBox = %q, want …× %q", got, want)
			}
		})
	}
	// Bare metal that says nothing of its idle: CPU, kernel and Go only.
	got := describeBox(files(map[string]string{cpuinfoPath: "model name\t: Xeon\nflags\t: fpu sse2\n"}))
	if want := "× Xeon, " + head; !strings.HasSuffix(got, want) {
		t.Errorf("describeBox = %q, want …%q", got, want)
	}
	if got := describeBox(files(nil)); !strings.Contains(got, "unknown CPU") {
		t.Errorf("describeBox with nothing readable = %q", got)
	}
}
