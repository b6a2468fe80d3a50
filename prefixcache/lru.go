package prefixcache

// lru is a set of keys in recency order: a map to nodes of a doubly
// linked list kept in slices (int32 links), so a block costs one map entry
// and 16 bytes, and freed nodes are reused.
type lru struct {
	pos        map[uint64]int32
	key        []uint64
	prev, next []int32
	head, tail int32 // most and least recent; -1 when empty
	free       int32 // free-node list through next; -1 when none
	len        int
}

func (l *lru) init() {
	*l = lru{pos: make(map[uint64]int32), head: -1, tail: -1, free: -1}
}

func (l *lru) unlink(n int32) {
	p, q := l.prev[n], l.next[n]
	if p >= 0 {
		l.next[p] = q
	} else {
		l.head = q
	}
	if q >= 0 {
		l.prev[q] = p
	} else {
		l.tail = p
	}
}

func (l *lru) pushFront(n int32) {
	l.prev[n], l.next[n] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = n
	} else {
		l.tail = n
	}
	l.head = n
}

// touch makes k the most recent, adding it if absent (reported).
func (l *lru) touch(k uint64) bool {
	if n, ok := l.pos[k]; ok {
		if n != l.head {
			l.unlink(n)
			l.pushFront(n)
		}
		return false
	}
	var n int32
	if l.free >= 0 {
		n, l.free = l.free, l.next[l.free]
		l.key[n] = k
	} else {
		n = int32(len(l.key))
		l.key = append(l.key, k)
		l.prev = append(l.prev, -1)
		l.next = append(l.next, -1)
	}
	l.pos[k] = n
	l.pushFront(n)
	l.len++
	return true
}

func (l *lru) drop(n int32) {
	l.unlink(n)
	delete(l.pos, l.key[n])
	l.next[n], l.free = l.free, n
	l.len--
}

// remove deletes k, reporting whether it was there.
func (l *lru) remove(k uint64) bool {
	n, ok := l.pos[k]
	if ok {
		l.drop(n)
	}
	return ok
}

// popOldest removes and returns the least recent key; the set must not be
// empty.
func (l *lru) popOldest() uint64 {
	n := l.tail
	k := l.key[n]
	l.drop(n)
	return k
}
