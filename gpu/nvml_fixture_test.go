//go:build cgo

package gpu

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeHost is a DGX A100-like host (8 × A100-SXM4-40GB) built on go-nvml's
// generated mocks. go-nvml's own mock/dgxa100 would do, but it imports
// github.com/google/uuid, which this module does not carry; this fixture
// follows its shape (mock.Interface + mock.Device with their Func fields)
// and adds the telemetry readings dgxa100 leaves unmocked.
type fakeHost struct {
	*mock.Interface
	mu      sync.Mutex // guards the fields below (the mocks are called from the code under test)
	gpus    []*fakeGPU
	queue   []nvml.EventData // pending events, drained by EventSet.Wait
	initRet nvml.Return
	inits   int
	shuts   int
	noXid   bool            // EventSetCreate fails
	missing map[string]bool // symbols the library lacks (an older driver's)
}

// fakeGPU is one mocked device and its current readings.
type fakeGPU struct {
	*mock.Device
	host    *fakeHost
	index   int
	uuid    string
	util    uint32
	mem     nvml.Memory // as the v1 call reports it: Used counts the driver's reservation
	reserve uint64      // the driver's reservation, which the v2 call reports apart
	powerMW uint32
	limitMW uint32
	tempC   uint32
	smMHz   uint32
	reasons uint64
	ecc     uint64
	lost    bool // every reading returns ERROR_GPU_IS_LOST
	noPower bool // power readings are not supported
	oldAPI  bool // GetCurrentClocksEventReasons missing (driver < 535)
	noMemV2 bool // GetMemoryInfo_v2 missing (driver < 510)
	memV2s  int  // calls of GetMemoryInfo_v2
}

func newFakeHost(n int) *fakeHost {
	h := &fakeHost{Interface: &mock.Interface{}}
	for i := range n {
		h.gpus = append(h.gpus, h.newGPU(i))
	}
	h.InitFunc = func() nvml.Return {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.inits++
		return h.initRet
	}
	h.ShutdownFunc = func() nvml.Return {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.shuts++
		return nvml.SUCCESS
	}
	h.ExtensionsFunc = func() nvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(sym string) error {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.missing[sym] {
				return fmt.Errorf("undefined symbol: %s", sym)
			}
			return nil
		}}
	}
	h.DeviceGetCountFunc = func() (int, nvml.Return) { return len(h.gpus), nvml.SUCCESS }
	h.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= len(h.gpus) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return h.gpus[i], nvml.SUCCESS
	}
	h.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		if h.noXid {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				h.mu.Lock()
				defer h.mu.Unlock()
				if len(h.queue) == 0 {
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
				ev := h.queue[0]
				h.queue = h.queue[1:]
				return ev, nvml.SUCCESS
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	return h
}

// called is a device call's check, under the host lock, that the library
// has its symbol: a real one without it kills the process.
func (h *fakeHost) called(sym string) {
	if h.missing[sym] {
		panic("symbol lookup error: undefined symbol: " + sym)
	}
}

// xid queues an Xid critical-error event on GPU i.
func (h *fakeHost) xid(i int, code uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.queue = append(h.queue, nvml.EventData{Device: h.gpus[i], EventType: nvml.EventTypeXidCriticalError, EventData: code})
}

func (h *fakeHost) counts() (inits, shuts int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.inits, h.shuts
}

// set changes GPU i's readings under the host lock.
func (h *fakeHost) set(i int, f func(g *fakeGPU)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h.gpus[i])
}

func (h *fakeHost) newGPU(i int) *fakeGPU {
	g := &fakeGPU{
		Device: &mock.Device{}, host: h, index: i,
		uuid:    fmt.Sprintf("GPU-a100%04x-0000-4000-8000-%012x", i, i),
		util:    uint32(10 * i),
		mem:     nvml.Memory{Total: 42949672960, Used: uint64(i)<<30 + 615<<20, Free: 42949672960 - uint64(i)<<30 - 615<<20},
		reserve: 615 << 20,
		powerMW: 90000 + uint32(i)*1000, limitMW: 400000, tempC: 30 + uint32(i), smMHz: 1410,
	}
	d := g.Device
	read := func(f func() nvml.Return) nvml.Return { // every reading: lock, lost check
		h.mu.Lock()
		defer h.mu.Unlock()
		if g.lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		return f()
	}
	d.GetUUIDFunc = func() (string, nvml.Return) { return g.uuid, nvml.SUCCESS }
	d.GetNameFunc = func() (string, nvml.Return) { return "Mock NVIDIA A100-SXM4-40GB", nvml.SUCCESS }
	d.GetIndexFunc = func() (int, nvml.Return) { return g.index, nvml.SUCCESS }
	d.GetMaxClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 1410, nvml.SUCCESS }
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError, nvml.SUCCESS
	}
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	d.GetUtilizationRatesFunc = func() (u nvml.Utilization, r nvml.Return) {
		r = read(func() nvml.Return { u = nvml.Utilization{Gpu: g.util, Memory: g.util / 2}; return nvml.SUCCESS })
		return
	}
	d.GetMemoryInfoFunc = func() (m nvml.Memory, r nvml.Return) {
		r = read(func() nvml.Return { m = g.mem; return nvml.SUCCESS })
		return
	}
	d.GetMemoryInfo_v2Func = func() (m nvml.Memory_v2, r nvml.Return) {
		r = read(func() nvml.Return {
			h.called("nvmlDeviceGetMemoryInfo_v2")
			g.memV2s++
			if g.noMemV2 {
				return nvml.ERROR_FUNCTION_NOT_FOUND
			}
			m = nvml.Memory_v2{Version: 2, Total: g.mem.Total, Reserved: g.reserve, Free: g.mem.Free, Used: g.mem.Used - g.reserve}
			return nvml.SUCCESS
		})
		return
	}
	d.GetPowerUsageFunc = func() (v uint32, r nvml.Return) {
		r = read(func() nvml.Return {
			if g.noPower {
				return nvml.ERROR_NOT_SUPPORTED
			}
			v = g.powerMW
			return nvml.SUCCESS
		})
		return
	}
	d.GetEnforcedPowerLimitFunc = func() (v uint32, r nvml.Return) {
		r = read(func() nvml.Return {
			if g.noPower {
				return nvml.ERROR_NOT_SUPPORTED
			}
			v = g.limitMW
			return nvml.SUCCESS
		})
		return
	}
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (v uint32, r nvml.Return) {
		r = read(func() nvml.Return { v = g.tempC; return nvml.SUCCESS })
		return
	}
	d.GetClockInfoFunc = func(nvml.ClockType) (v uint32, r nvml.Return) {
		r = read(func() nvml.Return { v = g.smMHz; return nvml.SUCCESS })
		return
	}
	d.GetCurrentClocksEventReasonsFunc = func() (v uint64, r nvml.Return) {
		r = read(func() nvml.Return {
			h.called("nvmlDeviceGetCurrentClocksEventReasons")
			if g.oldAPI {
				return nvml.ERROR_FUNCTION_NOT_FOUND
			}
			v = g.reasons
			return nvml.SUCCESS
		})
		return
	}
	d.GetCurrentClocksThrottleReasonsFunc = func() (v uint64, r nvml.Return) {
		r = read(func() nvml.Return { v = g.reasons; return nvml.SUCCESS })
		return
	}
	d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (v uint64, r nvml.Return) {
		r = read(func() nvml.Return { v = g.ecc; return nvml.SUCCESS })
		return
	}
	return g
}
