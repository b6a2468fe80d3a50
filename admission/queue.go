package admission

import "time"

// entry is one request waiting in a pool's queue. Its outcome (ticket or
// err) is written under the controller's lock before ready is closed.
type entry struct {
	cost    Cost
	tokens  int64
	class   int
	seq     uint64 // arrival order within the controller
	arrived time.Time
	tenant  *tenantQ   // its tenant's queue in the class; nil unless fairness is on
	share   *shareLoad // its tenant's queue share; nil unless shares are capped

	sjfIdx, tenIdx int    // positions in the class's and the tenant's heaps
	prev, next     *entry // the class's arrival-order list

	queued bool  // still in the queue (guarded by the controller's lock)
	timer  Timer // deadline timer, nil if none
	ready  chan struct{}
	ticket Ticket
	err    error
}

// shorter orders entries shortest expected cost first, then by arrival.
func shorter(a, b *entry) bool {
	if a.tokens != b.tokens {
		return a.tokens < b.tokens
	}
	return a.seq < b.seq
}

// tenantQ is one tenant's waiting requests within one class, for fairness.
type tenantQ struct {
	name  string
	q     indexedHeap[*entry] // its requests, shortest first
	vtime float64             // virtual time: tokens admitted, from when it became active
	seq   uint64              // activation order, to break vtime ties
	idx   int                 // position in the class's active heap
}

// shareLoad is one tenant's part of the whole queue, for the share cap.
type shareLoad struct {
	n      int
	tokens int64
}

// classQ is the queue of one priority class. Every entry is in the
// arrival-order list (for aging) and the shortest-first heap; with fairness
// on, it is also in its tenant's heap, and tenants with waiting requests
// are in a heap ordered by virtual time.
type classQ struct {
	head, tail *entry
	sjf        indexedHeap[*entry]
	tenants    map[string]*tenantQ // active tenants (fairness on)
	active     indexedHeap[*tenantQ]
	vnow       float64 // the class's virtual time: least vtime of an active tenant
	n          int
	tokens     int64
}

func newClassQ() classQ {
	return classQ{
		sjf:     indexedHeap[*entry]{less: shorter, at: func(e *entry) *int { return &e.sjfIdx }},
		tenants: make(map[string]*tenantQ),
		active: indexedHeap[*tenantQ]{
			less: func(a, b *tenantQ) bool {
				if a.vtime != b.vtime {
					return a.vtime < b.vtime
				}
				return a.seq < b.seq
			},
			at: func(t *tenantQ) *int { return &t.idx },
		},
	}
}

// push adds e; fair says whether to queue it under its tenant too.
func (q *classQ) push(e *entry, fair bool, seq uint64) {
	e.prev, e.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = e
	} else {
		q.head = e
	}
	q.tail = e
	q.sjf.push(e)
	q.n++
	q.tokens += e.tokens
	if !fair {
		return
	}
	t := q.tenants[e.cost.Tenant]
	if t == nil {
		// A tenant joins at the class's current virtual time: it gets its
		// fair share from now on, with no credit banked while it was idle.
		t = &tenantQ{
			name:  e.cost.Tenant,
			q:     indexedHeap[*entry]{less: shorter, at: func(e *entry) *int { return &e.tenIdx }},
			vtime: q.vnow,
			seq:   seq,
		}
		q.tenants[t.name] = t
		q.active.push(t)
	}
	e.tenant = t
	t.q.push(e)
}

// remove takes e out of every structure of the class.
func (q *classQ) remove(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		q.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		q.tail = e.prev
	}
	e.prev, e.next = nil, nil
	q.sjf.remove(e)
	q.n--
	q.tokens -= e.tokens
	if t := e.tenant; t != nil {
		t.q.remove(e)
		e.tenant = nil
		if t.q.len() == 0 {
			q.active.remove(t)
			delete(q.tenants, t.name)
		}
	}
}

// charge advances e's tenant's virtual time by e's cost, before e is
// removed on admission.
func (q *classQ) charge(e *entry) {
	t := e.tenant
	if t == nil {
		return
	}
	t.vtime += float64(e.tokens)
	q.active.fix(t.idx)
	q.vnow = max(q.vnow, q.active.min().vtime)
}

// aged reports whether e has waited at least the aging bound at now
// (a negative bound ages every request on arrival).
func aged(e *entry, now time.Time, bound time.Duration) bool {
	return bound < 0 || now.Sub(e.arrived) >= bound
}

// next is the request the class would admit next at now, and whether it
// is aged: the oldest request if it has waited the aging bound (aged
// requests go oldest-first), else the shortest request of the tenant with
// the least virtual time (fairness on), else the shortest request.
func (q *classQ) next(now time.Time, bound time.Duration, fair bool) (*entry, bool) {
	if q.head != nil && aged(q.head, now, bound) {
		return q.head, true
	}
	if fair && q.active.len() > 0 {
		return q.active.min().q.min(), false
	}
	return q.sjf.min(), false
}

// ahead sums the tokens of the class's requests that would go before a
// request of the given cost arriving now: shorter ones and aged ones. It
// ignores fairness and future arrivals; it is an estimate.
func (q *classQ) ahead(tokens int64, now time.Time, bound time.Duration) int64 {
	var sum int64
	for _, e := range q.sjf.s {
		if e.tokens <= tokens || aged(e, now, bound) {
			sum += e.tokens
		}
	}
	return sum
}
