package proxy

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/valyala/bytebufferpool"
)

// readAtMost reads a body whole however its reader splits it, stops at
// its limit, and passes a read's error on.
func TestReadAtMost(t *testing.T) {
	body := strings.Repeat("0123456789", 100)
	tests := []struct {
		name  string
		r     io.Reader
		limit int
		want  string
		err   error
	}{
		{"one byte a read", iotest.OneByteReader(strings.NewReader(body)), 2000, body, nil},
		{"data with EOF", iotest.DataErrReader(strings.NewReader(body)), 2000, body, nil},
		{"stops at its limit", strings.NewReader(body), 101, body[:101], nil},
		{"limit is the length", strings.NewReader(body), len(body), body, nil},
		{"a read fails", io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(io.ErrUnexpectedEOF)), 2000, "abc", io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			buf := bytebufferpool.Get()
			defer bytebufferpool.Put(buf)
			err := readAtMost(buf, tt.r, tt.limit)
			if !errors.Is(err, tt.err) || string(buf.B) != tt.want {
				t.Fatalf("read %d bytes, err %v; want %d bytes, err %v", len(buf.B), err, len(tt.want), tt.err)
			}
		})
	}
}
