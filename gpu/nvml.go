//go:build cgo

package gpu

import (
	"errors"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"
)

// NVML is this process's session with the local NVIDIA driver, shared by
// every source that reads local GPUs so that Init, Shutdown and the
// "telemetry off" log line happen once per process, not once per replica.
// It opens lazily on first use (or explicitly with Open). Where the driver
// library is absent, Init returns ERROR_LIBRARY_NOT_FOUND: the session is
// then off for good, logs one line, and every read returns ErrGPUOff.
// Build with NewNVML; the zero value is unusable. Safe for concurrent use.
type NVML struct {
	lib nvml.Interface
	log *zap.Logger

	// mu guards everything below and serialises this session's NVML calls,
	// so that draining the event set and reading counters never interleave.
	mu     sync.Mutex
	state  nvmlState
	offErr error // why the session is off (wraps ErrGPUOff)
	devs   []*nvmlDevice
	events nvml.EventSet // nil when the driver offers no Xid events
}

type nvmlState uint8

const (
	nvmlClosed nvmlState = iota // not opened yet, or closed
	nvmlOn
	nvmlOff
)

// nvmlDevice is what the session keeps about one GPU between reads: its
// handle, the facts that never change, and the Xid events counted so far.
type nvmlDevice struct {
	h        nvml.Device
	index    int
	uuid     string
	name     string
	maxSMMHz uint32
	xid      uint64 // critical Xid events seen since the session opened
	// What the driver's library lacks (before 510 and 535): such a
	// function must not be called (openLocked).
	memV1, throttleV1 bool
}

// NewLocalNVML is the session with this host's driver (go-nvml's
// library, loaded on first use). It calls nothing yet. log nil means no
// logging. Without cgo it is nvml_off.go's stand-in, always off.
func NewLocalNVML(log *zap.Logger) *NVML { return NewNVML(nvml.New(), log) }

// NewNVML returns a session over lib: nvml.New() in production, a mock in
// tests. It calls nothing in lib. log nil means no logging.
func NewNVML(lib nvml.Interface, log *zap.Logger) *NVML {
	if log == nil {
		log = zap.NewNop()
	}
	return &NVML{lib: lib, log: log}
}

// Open initialises NVML and enumerates the GPUs, once; later calls return
// the first outcome. It returns an error wrapping ErrGPUOff when there is no
// usable driver, after logging that once.
func (n *NVML) Open() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.openLocked()
}

func (n *NVML) openLocked() error {
	switch n.state {
	case nvmlOn:
		return nil
	case nvmlOff:
		return n.offErr
	}
	if ret := n.lib.Init(); ret != nvml.SUCCESS {
		return n.turnOff(ret, "Init")
	}
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		n.lib.Shutdown()
		return n.turnOff(ret, "DeviceGetCount")
	}
	// go-nvml binds the library's functions lazily: calling one the
	// driver's library lacks kills the process ("symbol lookup error"),
	// it returns no ERROR_FUNCTION_NOT_FOUND. So the newer calls the reads
	// prefer are looked up first, and their older twins used without them.
	memV1 := !n.has("nvmlDeviceGetMemoryInfo_v2")
	throttleV1 := !n.has("nvmlDeviceGetCurrentClocksEventReasons")
	devs := make([]*nvmlDevice, 0, count)
	for i := range count {
		h, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			// A GPU that fell off the bus still counts; skip it rather
			// than lose telemetry for the healthy ones.
			n.log.Warn("NVML: skipping GPU", zap.Int("index", i), zap.String("error", nvml.ErrorString(ret)))
			continue
		}
		d := &nvmlDevice{h: h, index: i, memV1: memV1, throttleV1: throttleV1}
		d.uuid, _ = h.GetUUID()
		d.name, _ = h.GetName()
		if idx, ret := h.GetIndex(); ret == nvml.SUCCESS {
			d.index = idx
		}
		if c, ret := h.GetMaxClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
			d.maxSMMHz = c
		}
		devs = append(devs, d)
	}
	n.devs = devs
	var xidGPUs int
	n.events, xidGPUs = n.registerXid(devs)
	n.state = nvmlOn
	// xid_events says whether a GPU fault can take a replica out of routing:
	// 0 on a driver or board that offers no Xid events.
	n.log.Info("GPU telemetry on: NVML", zap.Int("gpus", len(devs)), zap.Int("xid_events", xidGPUs))
	return nil
}

// has reports whether the loaded library exports sym.
func (n *NVML) has(sym string) bool {
	ext := n.lib.Extensions()
	return ext != nil && ext.LookupSymbol(sym) == nil
}

// turnOff records why the session is off and logs it, once.
func (n *NVML) turnOff(ret nvml.Return, call string) error {
	n.state = nvmlOff
	if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
		n.offErr = fmt.Errorf("%w: "+offNoLibrary, ErrGPUOff)
		n.log.Warn("GPU telemetry off: " + offNoLibrary)
	} else {
		n.offErr = fmt.Errorf("%w: NVML %s: %w", ErrGPUOff, call, ret)
		n.log.Warn("GPU telemetry off: NVML "+call+" failed", zap.String("error", nvml.ErrorString(ret)))
	}
	return n.offErr
}

// registerXid subscribes to critical Xid events on every GPU that offers
// them and says on how many it did; nil and 0 when none does (no events
// then, the rest still works).
func (n *NVML) registerXid(devs []*nvmlDevice) (nvml.EventSet, int) {
	set, ret := n.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		n.log.Debug("NVML: no event set, Xid errors not counted", zap.String("error", nvml.ErrorString(ret)))
		return nil, 0
	}
	registered := 0
	for _, d := range devs {
		supported, ret := d.h.GetSupportedEventTypes()
		if ret != nvml.SUCCESS || supported&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		if d.h.RegisterEvents(nvml.EventTypeXidCriticalError, set) == nvml.SUCCESS {
			registered++
		}
	}
	if registered == 0 {
		set.Free()
		return nil, 0
	}
	return set, registered
}

// drainXid counts the Xid events queued since the last read, without
// waiting. Application-induced Xids (a CUDA program's own fault) are not
// counted: they say nothing about the GPU's health.
func (n *NVML) drainXid() {
	if n.events == nil {
		return
	}
	for range 1024 { // bounded: a storm must not stall a read
		ev, ret := n.events.Wait(0)
		if ret != nvml.SUCCESS {
			return // ERROR_TIMEOUT: queue empty
		}
		if ev.EventType&nvml.EventTypeXidCriticalError == 0 || ev.Device == nil {
			continue
		}
		uuid, _ := ev.Device.GetUUID() // by UUID: handle types need not be comparable
		for _, d := range n.devs {
			if d.uuid != uuid {
				continue
			}
			if applicationXid(ev.EventData) {
				// Logged so that an operator who sees the Xid in the
				// kernel log knows the router saw it and kept the GPU.
				n.log.Info("GPU Xid caused by an application: GPU kept in routing",
					zap.Int("index", d.index), zap.String("uuid", d.uuid), zap.Uint64("xid", ev.EventData))
				break
			}
			d.xid++
			n.log.Warn("GPU Xid error", zap.Int("index", d.index), zap.String("uuid", d.uuid), zap.Uint64("xid", ev.EventData))
			break
		}
	}
}

// Read returns the GPUs sel selects, freshly read, in index order. It opens
// the session on first use and returns ErrGPUOff when NVML is unavailable,
// ErrGPUNotFound when sel names a GPU the host lacks, and an NVML error
// (errors.Is(err, nvml.ERROR_GPU_IS_LOST), …) when a selected GPU fails.
func (n *NVML) Read(sel Selector) ([]GPUStats, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.openLocked(); err != nil {
		return nil, err
	}
	n.drainXid()
	out := make([]GPUStats, 0, len(n.devs))
	var errs []error
	for _, d := range n.devs {
		if !sel.Match(d.index, d.uuid) {
			continue
		}
		st, err := d.read()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, st)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return sel.pick(out)
}

// Close shuts NVML down if the session opened it. A later Read reopens it.
func (n *NVML) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state != nvmlOn {
		return nil
	}
	if n.events != nil {
		n.events.Free()
		n.events = nil
	}
	n.state, n.devs = nvmlClosed, nil
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: NVML Shutdown: %w", ret)
	}
	return nil
}
