//go:build linux

package netloop

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// OpenEpollWake opens a loop's epoll set with an eventfd in it, which
// wakes the loop from other goroutines.
func OpenEpollWake() (ep, wake int, err error) {
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

// FDTable is a loop's sockets by descriptor: a slice indexed by
// descriptor, which the kernel hands out small and dense, so the lookup
// at every event hashes nothing. Its zero value is empty.
type FDTable[T any] struct {
	By []*T
	N  int // non-nil entries
}

func (t *FDTable[T]) Get(fd int) *T {
	if uint(fd) < uint(len(t.By)) {
		return t.By[fd]
	}
	return nil
}

func (t *FDTable[T]) Set(fd int, v *T) {
	if fd >= len(t.By) {
		t.By = append(t.By, make([]*T, fd+1-len(t.By)+len(t.By)/2)...)
	}
	if t.By[fd] == nil {
		t.N++
	}
	t.By[fd] = v
}

func (t *FDTable[T]) Del(fd int) {
	if t.Get(fd) != nil {
		t.By[fd] = nil
		t.N--
	}
}

// RawEpollWait is epoll_wait(2) on ep for at most ms milliseconds as a raw
// system call: the runtime is not told the thread blocks, so the calling
// loop keeps its P (streamPump.wait and requestLoop.wait say when that
// pays). A signal — a preemption, a stop-the-world — ends it with EINTR.
func RawEpollWait(ep int, events []unix.EpollEvent, ms int) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(ms), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
