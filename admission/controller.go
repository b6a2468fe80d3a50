package admission

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Deps are a Controller's collaborators. The zero value is usable.
type Deps struct {
	// Capacity answers whether the pool can take a request now. nil means
	// only Config.MaxInFlight and MaxOutstandingTokens limit admission (with
	// neither set, every request is admitted at once).
	Capacity Capacity
	// Pool, when Capacity is nil, is the pool the controller judges with
	// Config.Saturation (SaturationConfig.Admissible over Pool.Loads): the
	// router's case. nil with no Capacity: no pool-side limit.
	Pool LoadSource
	// Clock is the source of time and timers. nil means the wall clock.
	Clock Clock
	// Metrics receives the pool's series. nil means none are exported.
	Metrics *Metrics
}

// Controller is one pool's admission control: Admit lets a request through
// at once while the pool has room, or queues it at the router until room
// frees up (late binding: it goes to whichever replica frees first), or
// sheds it. The queue is re-checked when a ticket is released or placed,
// when Poke says capacity changed, and every RecheckInterval while Run
// runs.
//
// Safe for concurrent use. Build with New; the zero value is not usable.
// The fast path (queue empty, room available) takes one mutex and
// allocates nothing.
type Controller struct {
	// --- Immutable after New ---
	model string
	cfg   Config
	cap   Capacity
	clock Clock
	m     *poolMetrics
	est   *Estimator
	room  *roomRule // the saturation rule per replica; nil with a Capacity of one's own

	// nQueued mirrors queued for Poke's lock-free check.
	nQueued atomic.Int64

	// mu guards everything below.
	mu           sync.Mutex
	classes      []classQ
	queued       int   // requests waiting, all classes
	queuedTokens int64 // their cost
	shares       map[string]*shareLoad
	seq          uint64 // arrivals that reached the queue
	inFlight     int    // admitted, not released
	outstanding  int64  // their cost
	unplaced     int    // admitted from the queue, not yet Placed or released

	// Drain-rate learning: tokens released per second of busy time (time
	// with a non-empty queue, when releases measure the pool's capacity
	// rather than its offered load).
	busyMark   time.Time     // when busy time was last accounted
	busyTime   time.Duration // busy time in the current sample
	busyTokens int64         // tokens released in the current sample
	drainRate  float64       // tokens/s; 0 = unknown
}

// New builds a pool's controller; model labels its metrics. It starts
// nothing: call Run for the periodic re-check.
func New(model string, cfg Config, d Deps) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if d.Clock == nil {
		d.Clock = realClock{}
	}
	if d.Metrics == nil {
		d.Metrics, _ = NewMetrics(nil) // unregistered: cannot fail
	}
	c := &Controller{
		model:     model,
		cfg:       cfg,
		cap:       d.Capacity,
		clock:     d.Clock,
		m:         d.Metrics.forPool(model, cfg.Classes),
		est:       NewEstimator(cfg.Estimate),
		classes:   make([]classQ, cfg.Classes),
		shares:    make(map[string]*shareLoad),
		drainRate: cfg.InitialDrainRate,
	}
	c.est.m = c.m
	c.m.correction.Set(1)
	c.m.expectedOut.Set(float64(c.est.ExpectedOutput()))
	c.m.drainRate.Set(c.drainRate)
	for i := range c.classes {
		c.classes[i] = newClassQ()
	}
	if c.cap == nil && d.Pool != nil {
		c.cap = &poolCapacity{pool: d.Pool, sat: cfg.Saturation, clock: d.Clock}
		c.room = &roomRule{sat: cfg.Saturation}
	}
	return c, nil
}

// Model is the pool's model name, its metrics label.
func (c *Controller) Model() string { return c.model }

// Config is the effective configuration, defaults filled.
func (c *Controller) Config() Config { return c.cfg }

// Estimator is the model's token estimator, learning from released tickets.
func (c *Controller) Estimator() *Estimator { return c.est }

// Estimate is Estimator().Cost: a request's cost from the router's raw
// prompt estimate and max_tokens (0 if not given).
func (c *Controller) Estimate(rawPromptTokens, maxTokens int) Cost {
	return c.est.Cost(rawPromptTokens, maxTokens)
}

// Admit admits a request of the given cost, waiting in the pool's queue if
// the pool is saturated. On success the caller holds the ticket until the
// response ends and then releases it. Errors: a *ShedError (errors.Is
// ErrShed, and ErrQueueFull or ErrDeadline) when the request is refused —
// at once, never after waiting past its deadline — or ctx's error when ctx
// ends while the request waits (it leaves the queue at once).
func (c *Controller) Admit(ctx context.Context, cost Cost) (Ticket, error) {
	tokens := cost.charge()
	c.mu.Lock()
	if c.queued == 0 && c.fits(cost, tokens) {
		c.inFlight++
		c.outstanding += tokens
		longCap := c.longCap(cost)
		c.mu.Unlock()
		c.m.admittedNow.Inc()
		c.m.wait.Observe(0)
		return Ticket{c: c, cost: cost, tokens: tokens, longCap: longCap}, nil
	}
	return c.admitSlow(ctx, cost, tokens)
}

// admitSlow queues the request (or refuses it) and waits. Called with c.mu
// held; releases it.
func (c *Controller) admitSlow(ctx context.Context, cost Cost, tokens int64) (Ticket, error) {
	if err := ctx.Err(); err != nil {
		c.mu.Unlock()
		return Ticket{}, err
	}
	now := c.clock.Now()
	c.account(now, 0)
	class := clampClass(cost.Class, c.cfg.Classes)
	reason, ok := ReasonQueueFull, c.cfg.MaxQueueRequests >= 0
	if ok && !c.shareAllows(cost.Tenant, tokens) {
		reason, ok = ReasonTenantShare, false
	}
	if ok {
		reason, ok = c.makeRoom(class, tokens)
	}
	if !ok {
		err := c.shed(reason, class, 0)
		c.mu.Unlock()
		return Ticket{}, err
	}

	e := &entry{cost: cost, tokens: tokens, class: class, arrived: now, ready: make(chan struct{})}
	c.enqueue(e)
	c.dispatch(now)
	if !e.queued {
		c.mu.Unlock()
		return e.ticket, e.err
	}
	if pc, ok := c.cap.(*poolCapacity); ok {
		pc.holds(cost, c.m.countHold)
	}

	deadline, ownTimer := c.deadlineOf(ctx, cost, now)
	if !deadline.IsZero() {
		wait, known := c.estimateWait(e, now)
		// An SLO deadline (ExpireAtDeadline) is not judged by the queue's
		// drain-rate estimate, which is coarse: a request that might still
		// make it waits, and is shed the moment it no longer can.
		if !deadline.After(now) || known && !cost.ExpireAtDeadline && now.Add(wait).After(deadline) {
			c.dequeue(e)
			c.dispatch(now)
			err := c.shed(ReasonDeadline, class, wait)
			c.mu.Unlock()
			return Ticket{}, err
		}
		if ownTimer && (c.cfg.ExpireQueued || cost.ExpireAtDeadline) {
			e.timer = c.clock.AfterFunc(deadline.Sub(now), func() { c.expire(e) })
		}
	}
	c.mu.Unlock()

	select {
	case <-e.ready:
		return e.ticket, e.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if e.queued {
		now := c.clock.Now()
		c.account(now, 0)
		c.dequeue(e)
		c.dispatch(now)
		c.mu.Unlock()
		c.m.canceled.Inc()
		return Ticket{}, ctx.Err()
	}
	c.mu.Unlock()
	// Decided just as ctx ended: give back a ticket nobody will use.
	if e.err == nil {
		e.ticket.Release()
	}
	return Ticket{}, ctx.Err()
}

// deadlineOf is the request's deadline (zero: none) — the earlier of
// Cost.Deadline and the context's, else DefaultTimeout from now — and
// whether the controller must time it itself (a context deadline ends the
// wait on its own, as a context error).
func (c *Controller) deadlineOf(ctx context.Context, cost Cost, now time.Time) (time.Time, bool) {
	d, own := cost.Deadline, !cost.Deadline.IsZero()
	if cd, ok := ctx.Deadline(); ok && (d.IsZero() || cd.Before(d)) {
		d, own = cd, false
	}
	if d.IsZero() && c.cfg.DefaultTimeout > 0 {
		d, own = now.Add(c.cfg.DefaultTimeout), true
	}
	return d, own
}

// fits reports whether a request may be admitted now: within the
// controller's own caps and, if there is one, the pool's capacity.
func (c *Controller) fits(cost Cost, tokens int64) bool {
	if c.cfg.MaxInFlight > 0 && c.inFlight >= c.cfg.MaxInFlight {
		return false
	}
	if c.cfg.MaxOutstandingTokens > 0 && c.inFlight > 0 && c.outstanding+tokens > c.cfg.MaxOutstandingTokens {
		return false
	}
	return c.cap == nil || c.cap.Admissible(cost)
}

// longCap is the long-prefill cap of a ticket for cost, at the pool's
// fastest rate as the capacity check just before it saw it (under c.mu).
func (c *Controller) longCap(cost Cost) int {
	var perToken time.Duration
	if pc, ok := c.cap.(*poolCapacity); ok {
		perToken = pc.perToken
	}
	return c.cfg.Saturation.LongPrefillCap(cost, perToken)
}

// release returns an admitted request's tokens and admits whoever now fits.
func (c *Controller) release(tokens int64, unplaced bool) {
	c.mu.Lock()
	c.inFlight--
	c.outstanding -= tokens
	if unplaced {
		c.unplaced--
	}
	if c.queued > 0 {
		now := c.clock.Now()
		c.account(now, tokens)
		c.dispatch(now)
	}
	c.mu.Unlock()
}

// placed records that a request admitted from the queue is now counted by
// the balancer, so the next one can be checked against that.
func (c *Controller) placed() {
	c.mu.Lock()
	c.unplaced--
	if c.queued > 0 {
		now := c.clock.Now()
		c.account(now, 0)
		c.dispatch(now)
	}
	c.mu.Unlock()
}

// Waiting reports whether requests wait in the queue now: a lock-free
// read, for callers that would do work only to let one out.
func (c *Controller) Waiting() bool { return c.nQueued.Load() > 0 }

// Queued is how many requests wait in the queue now (a lock-free read):
// those a request joining it finds ahead of it, before priority and
// expected work reorder them.
func (c *Controller) Queued() int { return int(c.nQueued.Load()) }

// Poke re-checks the queue against capacity: call it when capacity may
// have grown (a telemetry update, a replica added). Cheap when nothing
// waits.
func (c *Controller) Poke() {
	if c.nQueued.Load() == 0 {
		return
	}
	c.mu.Lock()
	if c.queued > 0 {
		now := c.clock.Now()
		c.account(now, 0)
		c.dispatch(now)
	}
	c.mu.Unlock()
}

// Run re-checks the queue every RecheckInterval until ctx ends, a safety
// net for capacity changes nobody Poked about. It returns nil.
func (c *Controller) Run(ctx context.Context) error {
	tick := make(chan struct{}, 1)
	for {
		t := c.clock.AfterFunc(c.cfg.RecheckInterval, func() {
			select {
			case tick <- struct{}{}:
			default:
			}
		})
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-tick:
			c.Poke()
		}
	}
}

// dispatch admits queued requests while they fit, in order: strict
// priority between classes; within the top non-empty class the next
// request (aged first, else fair or shortest). When that request does not
// fit and is not aged, the class's shortest request may go instead; an aged
// request is never passed. Otherwise dispatch stops: nothing of a lower
// class passes a waiting higher class.
//
// At most MaxUnplaced admitted requests may be waiting to be placed: until
// the proxy has placed one on a replica, Capacity's answer does not yet
// count it, and admitting more against that answer would overfill the pool.
func (c *Controller) dispatch(now time.Time) {
	for c.queued > 0 && (c.cfg.MaxUnplaced < 0 || c.unplaced < c.cfg.MaxUnplaced) {
		q := c.topClass()
		e, isAged := q.next(now, c.cfg.AgingBound, c.cfg.TenantFairness)
		if !c.fits(e.cost, e.tokens) {
			if isAged {
				return
			}
			s := q.sjf.min()
			if s == e || !c.fits(s.cost, s.tokens) {
				return
			}
			e = s
		}
		c.grant(e, now)
	}
}

// topClass is the highest class with a waiting request; queued > 0.
func (c *Controller) topClass() *classQ {
	for i := len(c.classes) - 1; i > 0; i-- {
		if c.classes[i].n > 0 {
			return &c.classes[i]
		}
	}
	return &c.classes[0]
}

// grant admits a queued request.
func (c *Controller) grant(e *entry, now time.Time) {
	c.classes[e.class].charge(e)
	c.dequeue(e)
	c.inFlight++
	c.outstanding += e.tokens
	c.unplaced++
	waited := now.Sub(e.arrived)
	e.ticket = Ticket{c: c, cost: e.cost, tokens: e.tokens, waited: waited, unplaced: true, longCap: c.longCap(e.cost)}
	close(e.ready)
	c.m.admittedWait.Inc()
	c.m.wait.Observe(waited.Seconds())
}

// expire sheds a request whose deadline passed while it waited.
func (c *Controller) expire(e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !e.queued {
		return
	}
	now := c.clock.Now()
	c.account(now, 0)
	c.dequeue(e)
	e.err = c.shed(ReasonExpired, e.class, 0)
	close(e.ready)
	c.dispatch(now)
}
