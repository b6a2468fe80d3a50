package proxy

import (
	"testing"
	"unsafe"
)

// Every request allocates one exchange. Objects over 512 bytes that hold
// pointers carry an 8-byte malloc header, so 696 bytes is the most that
// fits the 704-byte size class: one word more and every request costs 64
// bytes more (BenchmarkProxyNonStream's B/op shows it). A field added here
// must be paid for by one taken out or narrowed.
func TestExchangeFitsItsSizeClass(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sized for 64-bit platforms")
	}
	if n := unsafe.Sizeof(exchange{}); n > 696 {
		t.Fatalf("exchange is %d bytes: over 696 it moves to the 768-byte size class", n)
	}
}
