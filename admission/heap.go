package admission

// indexedHeap is a binary min-heap whose elements know their own position
// (through at), so any element can be removed or re-sifted in O(log n) —
// what a queue needs when a waiting request is canceled or a tenant's
// virtual time moves. The zero value is not usable: set less and at.
type indexedHeap[T any] struct {
	s    []T
	less func(a, b T) bool
	at   func(T) *int // the element's index field; -1 when not in the heap
}

func (h *indexedHeap[T]) len() int { return len(h.s) }

// min is the least element; the zero T when empty.
func (h *indexedHeap[T]) min() T {
	if len(h.s) == 0 {
		var zero T
		return zero
	}
	return h.s[0]
}

func (h *indexedHeap[T]) push(x T) {
	*h.at(x) = len(h.s)
	h.s = append(h.s, x)
	h.up(len(h.s) - 1)
}

// remove takes x out of the heap; x must be in it.
func (h *indexedHeap[T]) remove(x T) {
	i := *h.at(x)
	last := len(h.s) - 1
	if i != last {
		h.swap(i, last)
	}
	var zero T
	h.s[last] = zero // let the GC have it
	h.s = h.s[:last]
	*h.at(x) = -1
	if i != last {
		h.fix(i)
	}
}

// fix restores the order after the element at i changed.
func (h *indexedHeap[T]) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h *indexedHeap[T]) swap(i, j int) {
	h.s[i], h.s[j] = h.s[j], h.s[i]
	*h.at(h.s[i]) = i
	*h.at(h.s[j]) = j
}

func (h *indexedHeap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.s[i], h.s[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts i down and reports whether it moved.
func (h *indexedHeap[T]) down(i int) bool {
	start := i
	n := len(h.s)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.less(h.s[r], h.s[l]) {
			m = r
		}
		if !h.less(h.s[m], h.s[i]) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > start
}
