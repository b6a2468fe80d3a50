package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile starts writing a CPU profile of this process to path
// (serve --cpu-profile): what an operator sends along with a performance
// report, and what cmd/gpurouter/default.pgo, the profile the Go
// toolchain optimizes every build with, is renewed from (README,
// "Performance"). stop ends it and closes the file; the profile is
// whole only once stop has returned.
func startCPUProfile(path string) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}
