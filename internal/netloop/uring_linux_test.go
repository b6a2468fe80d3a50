//go:build linux

package netloop

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gpurouter/gpurouter/internal/netloop/looptest"

	"golang.org/x/sys/unix"
)

func openTestURing(t *testing.T) *Ring {
	t.Helper()
	u, err := OpenRing()
	if err != nil {
		t.Skipf("io_uring refused by this kernel: %v", err)
	}
	t.Cleanup(u.Close)
	return u
}

// The ring's structures are the kernel's ABI to the byte.
func TestURingABISizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"io_uring_params", unsafe.Sizeof(uringParams{}), 120},
		{"io_uring_sqe", unsafe.Sizeof(uringSQE{}), 64},
		{"io_uring_cqe", unsafe.Sizeof(uringCQE{}), 16},
		{"io_uring_sqe.user_data offset", unsafe.Offsetof(uringSQE{}.userData), 32},
		{"io_uring_params.sq_off offset", unsafe.Offsetof(uringParams{}.sqOff), 40},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, the kernel's is %d", c.name, c.got, c.want)
		}
	}
}

// A ring's batch does what the system calls would have: every write and
// read made, in one call, each result given back — bytes, EAGAIN for a
// socket with nothing to read or no room, EPIPE for a peer gone.
func TestURingMakesWhatSystemCallsWould(t *testing.T) {
	u := openTestURing(t)
	const n = 6
	var as, bs [n]int
	for i := range n {
		as[i], bs[i] = looptest.SocketPair(t)
	}
	results := map[int]string{}
	collect := func(i, n int, err error) {
		if _, dup := results[i]; dup {
			t.Errorf("operation %d given twice", i)
		}
		if err != nil {
			results[i] = err.Error()
			return
		}
		results[i] = strings.Repeat("x", n)
	}
	for i := range n {
		u.Prepare(OpSend, as[i], bytes.Repeat([]byte("x"), 100+i), i)
	}
	u.Run(collect)
	for i := range n {
		if results[i] != strings.Repeat("x", 100+i) {
			t.Fatalf("send %d: %q, want %d bytes", i, results[i], 100+i)
		}
	}
	clear(results)
	bufs := make([][]byte, n+1)
	for i := range n {
		bufs[i] = make([]byte, 4096)
		u.Prepare(OpRecv, bs[i], bufs[i], i)
	}
	bufs[n] = make([]byte, 16)
	u.Prepare(OpRecv, as[0], bufs[n], n) // nothing sent that way
	u.Run(collect)
	for i := range n {
		if results[i] != strings.Repeat("x", 100+i) || !bytes.Equal(bufs[i][:100+i], bytes.Repeat([]byte("x"), 100+i)) {
			t.Fatalf("recv %d: %q, want what send %d sent", i, results[i], i)
		}
	}
	if results[n] != unix.EAGAIN.Error() {
		t.Fatalf("recv on an empty socket: %q, want EAGAIN", results[n])
	}

	// A peer that closed, and a socket with no room: filled last, as its
	// peer's buffer may take more as time passes.
	unix.Shutdown(bs[2], unix.SHUT_RDWR) //nolint:errcheck
	unix.Close(bs[2])
	bs[2] = -1
	time.Sleep(20 * time.Millisecond) // the FIN comes back over loopback
	Write(as[2], []byte("x"))         //nolint:errcheck // the first write after the peer closed draws its reset
	time.Sleep(20 * time.Millisecond)
	full := as[1]
	unix.SetsockoptInt(full, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096) //nolint:errcheck
	big := make([]byte, 1<<16)
	for range 100 {
		// Full once a write finds no room after the ACKs in flight came:
		// until then each frees some.
		for {
			if _, err := Write(full, big); err != nil {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		if _, err := Write(full, big[:1]); err == unix.EAGAIN {
			break
		}
	}
	clear(results)
	u.Prepare(OpSend, full, []byte("more"), 0)
	u.Prepare(OpSend, as[2], []byte("late"), 1)
	start := time.Now()
	u.Run(collect)
	if results[0] != unix.EAGAIN.Error() {
		t.Errorf("send to a full socket: %q, want EAGAIN", results[0])
	}
	if results[1] != unix.EPIPE.Error() && results[1] != unix.ECONNRESET.Error() {
		t.Errorf("send to a peer gone: %q, want EPIPE or ECONNRESET", results[1])
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("a batch with a full socket took %v: an operation waited", d)
	}
}

// A ring whose wait fails with an errno the kernel is not documented to
// return is an error, not a panic: each operation it did not see end is
// given the error.
func TestURingFailureIsAnError(t *testing.T) {
	u := openTestURing(t)
	a, _ := looptest.SocketPair(t)
	failed := errors.New("io_uring_enter waiting for completions: an errno not documented")
	u.err = failed
	got := map[int]error{}
	u.Prepare(OpSend, a, []byte("x"), 3)
	u.Prepare(OpSend, a, []byte("y"), 7)
	if err := u.Run(func(i, n int, err error) { got[i] = err }); err != failed {
		t.Fatalf("run: %v, want the failure", err)
	}
	if len(got) != 2 || got[3] != failed || got[7] != failed {
		t.Fatalf("operations given %v, want the failure each", got)
	}
}
