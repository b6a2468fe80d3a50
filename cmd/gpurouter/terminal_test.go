package main

import (
	"bytes"
	"io"
	"os"
	"testing"
)

// Progress bars go to terminals only: a pipe, a file, /dev/null (a
// character device, not a terminal) and a buffer get none.
func TestTerminalOnlyForTerminals(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	file, err := os.Create(t.TempDir() + "/out")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	for name, w := range map[string]io.Writer{"pipe": w, "dev null": devNull, "file": file, "buffer": &bytes.Buffer{}} {
		if got := terminal(w); got != nil {
			t.Errorf("%s: terminal() = %v, want nil (no progress bar)", name, got)
		}
	}
}
