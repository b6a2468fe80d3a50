//go:build linux

package proxy

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// openEpollWake opens a loop's epoll set with an eventfd in it, which
// wakes the loop from other goroutines.
func openEpollWake() (ep, wake int, err error) {
	if ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return -1, -1, err
	}
	if wake, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		unix.Close(ep)
		return -1, -1, err
	}
	if err = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return -1, -1, err
	}
	return ep, wake, nil
}

// fdTable is a loop's sockets by descriptor: a slice indexed by
// descriptor, which the kernel hands out small and dense, so the lookup
// at every event hashes nothing. Its zero value is empty.
type fdTable[T any] struct {
	by []*T
	n  int // non-nil entries
}

func (t *fdTable[T]) get(fd int) *T {
	if uint(fd) < uint(len(t.by)) {
		return t.by[fd]
	}
	return nil
}

func (t *fdTable[T]) set(fd int, v *T) {
	if fd >= len(t.by) {
		t.by = append(t.by, make([]*T, fd+1-len(t.by)+len(t.by)/2)...)
	}
	if t.by[fd] == nil {
		t.n++
	}
	t.by[fd] = v
}

func (t *fdTable[T]) del(fd int) {
	if t.get(fd) != nil {
		t.by[fd] = nil
		t.n--
	}
}

// rawEpollWait is epoll_wait(2) on ep for at most ms milliseconds as a raw
// system call: the runtime is not told the thread blocks, so the calling
// loop keeps its P (streamPump.wait and requestLoop.wait say when that
// pays). A signal — a preemption, a stop-the-world — ends it with EINTR.
func rawEpollWait(ep int, events []unix.EpollEvent, ms int) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(ms), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
