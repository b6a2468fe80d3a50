package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// readProfile reads a pprof profile's protobuf (the runtime gzips it)
// and checks it is a CPU profile: its sample types name cpu and
// nanoseconds.
func readProfile(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s is not a gzipped profile: %v", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s is cut short: %v", path, err)
	}
	if !bytes.Contains(b, []byte("cpu")) || !bytes.Contains(b, []byte("nanoseconds")) {
		t.Fatalf("%s is not a CPU profile (%d bytes)", path, len(b))
	}
	return b
}

func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	stop, err := startCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	// One profile at a time in a process: a second fails and leaves no
	// file behind.
	second := filepath.Join(t.TempDir(), "second.pprof")
	if stop2, err := startCPUProfile(second); err == nil {
		stop2() //nolint:errcheck
		t.Fatal("a second CPU profile started while one runs")
	}
	if _, err := os.Stat(second); !os.IsNotExist(err) {
		t.Fatalf("the failed profile left %s (%v)", second, err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	readProfile(t, path)
	if _, err := startCPUProfile(filepath.Join(t.TempDir(), "no", "such", "dir.pprof")); err == nil {
		t.Fatal("a profile started in a directory that does not exist")
	}
}
