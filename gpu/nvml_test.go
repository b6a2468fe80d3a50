//go:build cgo

package gpu

import (
	"context"
	"errors"
	"os/exec"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap/zapcore"
)

func TestNVMLReadsEveryGPU(t *testing.T) {
	t.Parallel()
	h := newFakeHost(8)
	h.set(3, func(g *fakeGPU) {
		g.reasons = nvml.ClocksEventReasonGpuIdle | nvml.ClocksEventReasonSwPowerCap | nvml.ClocksThrottleReasonHwThermalSlowdown
		g.ecc = 2
	})
	n := NewNVML(h, nil)
	defer n.Close()
	gpus, err := NewNVMLSource(n, Selector{}).Fetch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs, want 8", len(gpus))
	}
	g := gpus[3]
	want := GPUStats{Index: 3, UUID: h.gpus[3].uuid, Name: "Mock NVIDIA A100-SXM4-40GB", UtilizationPct: 30,
		MemoryUsedBytes: 3 << 30, MemoryTotalBytes: 42949672960, PowerWatts: 93, PowerLimitWatts: 400,
		TemperatureC: 33, SMClockMHz: 1410, SMClockMaxMHz: 1410, ECCUncorrected: 2,
		ThrottleReasons: []string{"sw_power_cap", "hw_thermal_slowdown"}}
	if !equalGPU(g, want) {
		t.Errorf("GPU 3:\n got %+v\nwant %+v", g, want)
	}
	for i, g := range gpus {
		if g.Index != i {
			t.Errorf("gpus[%d].Index = %d: not in index order", i, g.Index)
		}
	}
	if len(gpus[0].ThrottleReasons) != 0 {
		t.Errorf("an idle GPU has no slowdown reasons, got %v", gpus[0].ThrottleReasons)
	}
}

// Memory in use excludes the driver's reservation, as nvidia-smi and DCGM's
// FB_USED report it (a real idle H200 reads 615 MiB through the v1 call and
// 0 through v2). A driver without the v2 call gets v1, asked for v2 once.
func TestNVMLMemoryExcludesTheDriversReservation(t *testing.T) {
	t.Parallel()
	h := newFakeHost(2)
	h.set(1, func(g *fakeGPU) { g.noMemV2 = true })
	n := NewNVML(h, nil)
	defer n.Close()
	for range 3 {
		gpus, err := n.Read(Selector{})
		if err != nil {
			t.Fatal(err)
		}
		if got := gpus[0].MemoryUsedBytes; got != 0 {
			t.Errorf("idle GPU 0 with a 615 MiB reservation reads %d bytes used, want 0", got)
		}
		if got, want := gpus[1].MemoryUsedBytes, uint64(1<<30+615<<20); got != want {
			t.Errorf("GPU 1 without the v2 call reads %d bytes used, want v1's %d", got, want)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.gpus[1].memV2s; c != 1 {
		t.Errorf("GetMemoryInfo_v2 asked %d times of a driver that lacks it, want 1", c)
	}
	if c := h.gpus[0].memV2s; c != 3 {
		t.Errorf("GetMemoryInfo_v2 asked %d times in 3 reads, want 3", c)
	}
}

// A library from an older driver lacks the newer calls the reads prefer
// (memory v2 before 510, clock-event reasons before 535). go-nvml binds
// lazily, so calling one would kill the process: the session looks the
// symbols up and uses the older calls (the fixture panics if not).
func TestNVMLLeavesOutWhatTheDriverLacks(t *testing.T) {
	t.Parallel()
	h := newFakeHost(2)
	h.missing = map[string]bool{"nvmlDeviceGetMemoryInfo_v2": true, "nvmlDeviceGetCurrentClocksEventReasons": true}
	h.set(1, func(g *fakeGPU) { g.reasons = nvml.ClocksEventReasonSwPowerCap })
	n := NewNVML(h, nil)
	defer n.Close()
	gpus, err := n.Read(Selector{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := gpus[1].MemoryUsedBytes, uint64(1<<30+615<<20); got != want {
		t.Errorf("GPU 1 reads %d bytes used, want v1's %d", got, want)
	}
	if !slices.Equal(gpus[1].ThrottleReasons, []string{"sw_power_cap"}) {
		t.Errorf("GPU 1's slowdown reasons %v, want [sw_power_cap] from the older call", gpus[1].ThrottleReasons)
	}
}

func equalGPU(a, b GPUStats) bool {
	return reflect.DeepEqual(a, b) || (len(a.ThrottleReasons) == 0 && len(b.ThrottleReasons) == 0 && func() bool {
		a.ThrottleReasons, b.ThrottleReasons = nil, nil
		return reflect.DeepEqual(a, b)
	}())
}

func TestNVMLSelectors(t *testing.T) {
	t.Parallel()
	h := newFakeHost(8)
	n := NewNVML(h, nil)
	defer n.Close()
	for _, tc := range []struct {
		name    string
		sel     Selector
		want    []int
		wantErr error
	}{
		{"all", Selector{}, []int{0, 1, 2, 3, 4, 5, 6, 7}, nil},
		{"indexes, any order", Selector{Indexes: []int{5, 1}}, []int{1, 5}, nil},
		{"UUID", Selector{UUIDs: []string{h.gpus[6].uuid}}, []int{6}, nil},
		{"index and UUID of one GPU", Selector{Indexes: []int{2}, UUIDs: []string{h.gpus[2].uuid}}, []int{2}, nil},
		{"index out of range", Selector{Indexes: []int{8}}, nil, ErrGPUNotFound},
		{"unknown UUID", Selector{UUIDs: []string{"GPU-nope"}, Indexes: []int{0}}, nil, ErrGPUNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus, err := NewNVMLSource(n, tc.sel).Fetch(context.Background())
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			var got []int
			for _, g := range gpus {
				got = append(got, g.Index)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("indexes %v, want %v", got, tc.want)
			}
		})
	}
	if inits, _ := h.counts(); inits != 1 {
		t.Errorf("Init called %d times by one session, want 1", inits)
	}
}

func TestNVMLBestEffortAndFailures(t *testing.T) {
	t.Parallel()
	h := newFakeHost(2)
	h.set(0, func(g *fakeGPU) { g.noPower, g.oldAPI, g.reasons = true, true, nvml.ClocksEventReasonSwThermalSlowdown })
	n := NewNVML(h, nil)
	defer n.Close()
	src := NewNVMLSource(n, Selector{Indexes: []int{0}})
	gpus, err := src.Fetch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if g := gpus[0]; g.PowerWatts != 0 || g.PowerLimitWatts != 0 || !slices.Equal(g.ThrottleReasons, []string{"sw_thermal_slowdown"}) {
		t.Errorf("unsupported power must read 0 and old drivers use the throttle-reasons call: %+v", g)
	}
	// A GPU that fell off the bus fails the replica bound to it, not the others.
	h.set(1, func(g *fakeGPU) { g.lost = true })
	if _, err := NewNVMLSource(n, Selector{Indexes: []int{1}}).Fetch(context.Background()); !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		t.Errorf("lost GPU: err = %v", err)
	}
	if _, err := src.Fetch(context.Background()); err != nil {
		t.Errorf("healthy GPU 0 failed because GPU 1 is lost: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := src.Fetch(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: %v", err)
	}
}

func TestNVMLCountsXidEvents(t *testing.T) {
	t.Parallel()
	h := newFakeHost(2)
	log, logs := observedLogger(zapcore.InfoLevel)
	n := NewNVML(h, log)
	defer n.Close()
	if err := n.Open(); err != nil {
		t.Fatal(err)
	}
	if on := logs.FilterMessage("GPU telemetry on: NVML").All(); len(on) != 1 || on[0].ContextMap()["xid_events"] != int64(2) {
		t.Errorf("the startup line must say on how many GPUs Xids are counted: %v", on)
	}
	h.xid(1, 79) // GPU fell off the bus
	h.xid(1, 13) // application fault: not counted
	h.xid(1, 48) // double-bit ECC
	h.xid(0, 31) // application fault
	gpus, err := n.Read(Selector{})
	if err != nil {
		t.Fatal(err)
	}
	if gpus[0].XidErrors != 0 || gpus[1].XidErrors != 2 {
		t.Errorf("Xid counts %d, %d; want 0, 2", gpus[0].XidErrors, gpus[1].XidErrors)
	}
	if got := logs.FilterMessage("GPU Xid error").Len(); got != 2 {
		t.Errorf("%d Xid log lines, want 2", got)
	}
	if got := logs.FilterMessage("GPU Xid caused by an application: GPU kept in routing").Len(); got != 2 {
		t.Errorf("%d application-Xid log lines, want 2", got)
	}
	// Counts are cumulative, events are consumed once.
	if gpus, _ = n.Read(Selector{}); gpus[1].XidErrors != 2 {
		t.Errorf("after a second read: %d", gpus[1].XidErrors)
	}
	// No event set: everything else still works.
	h2 := newFakeHost(1)
	h2.noXid = true
	log2, logs2 := observedLogger(zapcore.InfoLevel)
	if _, err := NewNVML(h2, log2).Read(Selector{}); err != nil {
		t.Errorf("without events: %v", err)
	}
	if on := logs2.FilterMessage("GPU telemetry on: NVML").All(); len(on) != 1 || on[0].ContextMap()["xid_events"] != int64(0) {
		t.Errorf("without events the startup line must say xid_events 0: %v", on)
	}
}

// No driver: Init says ERROR_LIBRARY_NOT_FOUND (what go-nvml returns when
// dlopen("libnvidia-ml.so.1") fails). The session is off, says so in exactly
// one log line however many sources and reads there are, and never retries.
func TestNVMLAbsentIsOffWithOneLogLine(t *testing.T) {
	t.Parallel()
	h := newFakeHost(0)
	h.initRet = nvml.ERROR_LIBRARY_NOT_FOUND
	log, logs := observedLogger(zapcore.DebugLevel)
	n := NewNVML(h, log)
	var wg sync.WaitGroup
	for i := range 8 {
		src := NewNVMLSource(n, Selector{Indexes: []int{i}})
		wg.Go(func() {
			for range 5 {
				if _, err := src.Fetch(context.Background()); !errors.Is(err, ErrGPUOff) {
					t.Errorf("err = %v, want ErrGPUOff", err)
				}
			}
		})
	}
	wg.Wait()
	if err := n.Open(); !errors.Is(err, ErrGPUOff) {
		t.Errorf("Open: %v", err)
	}
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d log lines, want exactly 1: %v", len(entries), entries)
	}
	if e := entries[0]; e.Message != "GPU telemetry off: libnvidia-ml.so.1 not found" || e.Level != zapcore.WarnLevel {
		t.Errorf("log line %q at %v", e.Message, e.Level)
	}
	if inits, shuts := h.counts(); inits != 1 || shuts != 0 {
		t.Errorf("Init %d times, Shutdown %d times; want 1, 0", inits, shuts)
	}
	if err := n.Close(); err != nil {
		t.Errorf("Close of an off session: %v", err)
	}
}

// Real go-nvml, no mock: on a machine without the driver this is the path
// `gpurouter agent` takes; on a GPU machine it must read real GPUs.
func TestNVMLRealLibrary(t *testing.T) {
	t.Parallel()
	log, logs := observedLogger(zapcore.InfoLevel)
	n := NewNVML(nvml.New(), log)
	defer n.Close()
	gpus, err := n.Read(Selector{})
	switch {
	case errors.Is(err, ErrGPUOff):
		if logs.Len() != 1 {
			t.Errorf("%d log lines: %v", logs.Len(), logs.All())
		}
		t.Logf("no NVIDIA driver here: %v", err)
	case err != nil:
		t.Fatal(err)
	default:
		if len(gpus) == 0 {
			t.Fatal("NVML is up but lists no GPU")
		}
		for _, g := range gpus {
			if !strings.HasPrefix(g.UUID, "GPU-") || g.Name == "" || g.MemoryTotalBytes == 0 ||
				g.MemoryUsedBytes > g.MemoryTotalBytes || g.UtilizationPct > 100 || g.SMClockMaxMHz == 0 ||
				g.TemperatureC <= 0 || g.TemperatureC > 120 {
				t.Errorf("implausible GPU: %+v", g)
			}
			t.Logf("%+v", g)
		}
		compareWithNvidiaSMI(t, gpus)
	}
}

// compareWithNvidiaSMI checks identity and memory size against nvidia-smi,
// when the driver's own tool is there: the readings that cannot drift
// between two calls a moment apart.
func compareWithNvidiaSMI(t *testing.T, gpus []GPUStats) {
	smi, err := exec.LookPath("nvidia-smi")
	if err != nil {
		t.Log("nvidia-smi not on PATH: no cross-check")
		return
	}
	out, err := exec.Command(smi, "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits").Output()
	if err != nil {
		t.Fatalf("nvidia-smi: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(gpus) {
		t.Fatalf("nvidia-smi lists %d GPUs, NVML %d", len(lines), len(gpus))
	}
	for i, line := range lines {
		f := strings.Split(line, ", ")
		if len(f) != 3 {
			t.Fatalf("nvidia-smi line %q", line)
		}
		idx, _ := strconv.Atoi(f[0])
		mib, _ := strconv.ParseUint(f[2], 10, 64)
		g := gpus[i]
		if g.Index != idx || g.UUID != f[1] || g.MemoryTotalBytes>>20 != mib {
			t.Errorf("GPU %d: NVML index %d, %s, %d MiB; nvidia-smi %q", i, g.Index, g.UUID, g.MemoryTotalBytes>>20, line)
		}
	}
}

func TestNVMLOtherInitFailure(t *testing.T) {
	t.Parallel()
	h := newFakeHost(1)
	h.initRet = nvml.ERROR_DRIVER_NOT_LOADED
	log, logs := observedLogger(zapcore.DebugLevel)
	_, err := NewNVML(h, log).Read(Selector{})
	if !errors.Is(err, ErrGPUOff) || !errors.Is(err, nvml.ERROR_DRIVER_NOT_LOADED) {
		t.Errorf("err = %v", err)
	}
	if logs.Len() != 1 {
		t.Errorf("%d log lines", logs.Len())
	}
}

func TestNVMLCloseAndReopen(t *testing.T) {
	t.Parallel()
	h := newFakeHost(1)
	n := NewNVML(h, nil)
	if _, err := n.Read(Selector{}); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Read(Selector{}); err != nil {
		t.Fatal(err)
	}
	n.Close()
	if inits, shuts := h.counts(); inits != 2 || shuts != 2 {
		t.Errorf("Init %d, Shutdown %d; want 2, 2", inits, shuts)
	}
}
