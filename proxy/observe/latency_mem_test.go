package observe

import (
	"testing"

	"github.com/gpurouter/gpurouter/sketch"
)

// The memory the package doc states per replica.
func TestLatencyMemoryPerReplica(t *testing.T) {
	b := latencyBytesPerReplica()
	t.Logf("%d bytes per replica (%d windows of %v, %d bins)", b, LatencyWindows, LatencyWindow, sketch.Bins())
	if b < 200<<10 || b > 260<<10 {
		t.Errorf("%d bytes per replica; the doc says about 236 KB", b)
	}
}
