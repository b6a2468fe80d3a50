package sim

// deque is a FIFO of sequences with cheap push at both ends.
type deque struct {
	buf        []*seq
	head, size int
}

func (q *deque) len() int { return q.size }

func (q *deque) grow() {
	nb := make([]*seq, max(16, 2*len(q.buf)))
	for i := range q.size {
		nb[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.buf, q.head = nb, 0
}

func (q *deque) pushBack(s *seq) {
	if q.size == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.size)%len(q.buf)] = s
	q.size++
}

func (q *deque) pushFront(s *seq) {
	if q.size == len(q.buf) {
		q.grow()
	}
	q.head = (q.head - 1 + len(q.buf)) % len(q.buf)
	q.buf[q.head] = s
	q.size++
}

func (q *deque) front() *seq { return q.buf[q.head] }

func (q *deque) popFront() *seq {
	s := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.size--
	return s
}

func (q *deque) at(i int) *seq { return q.buf[(q.head+i)%len(q.buf)] }

// remove deletes s, keeping order.
func (q *deque) remove(s *seq) {
	for i := range q.size {
		if q.at(i) != s {
			continue
		}
		for j := i; j < q.size-1; j++ {
			q.buf[(q.head+j)%len(q.buf)] = q.at(j + 1)
		}
		q.buf[(q.head+q.size-1)%len(q.buf)] = nil
		q.size--
		return
	}
}
