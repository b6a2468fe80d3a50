//go:build !unix

package gpu

import (
	"testing"
	"time"
)

// cpuTime is 0 where getrusage(2) is missing: the benchmark judges no
// CPU budget.
func cpuTime(*testing.B) time.Duration { return 0 }
