//go:build linux

package proxy

import (
	"github.com/gpurouter/gpurouter/internal/netloop"
	"testing"
)

// skipWithoutRing skips a test of the loops' batches where the kernel
// refuses io_uring.
func skipWithoutRing(t *testing.T) {
	t.Helper()
	u, err := netloop.OpenRing()
	if err != nil {
		t.Skipf("io_uring refused by this kernel: %v", err)
	}
	u.Close()
}
