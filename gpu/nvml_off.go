//go:build !cgo

package gpu

import (
	"fmt"
	"sync"

	"go.uber.org/zap"
)

// NVML stands in for the session with the local driver in a build without
// cgo, which go-nvml needs: it is what a host without the driver's library
// gets (nvml.go) — off for good, one log line at its first use, and every
// read ErrGPUOff — so the rest of the router works as there. Build with
// NewLocalNVML. Safe for concurrent use.
type NVML struct {
	log  *zap.Logger
	once sync.Once
	err  error
}

// NewLocalNVML is the session a build with cgo would open; here, always
// off. It logs nothing yet. log nil means no logging.
func NewLocalNVML(log *zap.Logger) *NVML {
	if log == nil {
		log = zap.NewNop()
	}
	return &NVML{log: log}
}

// Open turns the session off, once, with the line a host without the
// library logs; it returns an error wrapping ErrGPUOff.
func (n *NVML) Open() error {
	n.once.Do(func() {
		n.err = fmt.Errorf("%w: "+offNoLibrary, ErrGPUOff)
		n.log.Warn("GPU telemetry off: " + offNoLibrary)
	})
	return n.err
}

// Read returns Open's error: there are no GPUs to read.
func (n *NVML) Read(Selector) ([]GPUStats, error) { return nil, n.Open() }

// Close does nothing: nothing was opened.
func (n *NVML) Close() error { return nil }
