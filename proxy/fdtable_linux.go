//go:build linux

package proxy

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
