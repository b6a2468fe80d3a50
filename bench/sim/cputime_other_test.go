//go:build !unix

package sim

import (
	"time"
)

// processCPU is 0 where getrusage(2) is missing: the benchmark reports
// no CPU time.
func processCPU() time.Duration { return 0 }
