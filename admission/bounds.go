package admission

// enqueue adds e to its class, the totals and its tenant's share.
func (c *Controller) enqueue(e *entry) {
	c.seq++
	e.seq = c.seq
	e.queued = true
	q := &c.classes[e.class]
	q.push(e, c.cfg.TenantFairness, e.seq)
	c.queued++
	c.queuedTokens += e.tokens
	if c.cfg.TenantQueueShare > 0 {
		s := c.shares[e.cost.Tenant]
		if s == nil {
			s = &shareLoad{}
			c.shares[e.cost.Tenant] = s
		}
		s.n++
		s.tokens += e.tokens
		e.share = s
	}
	c.nQueued.Store(int64(c.queued))
	c.m.depth[e.class].Set(float64(q.n))
	c.m.tokens.Set(float64(c.queuedTokens))
}

// dequeue takes e out of the queue (admitted, shed or canceled) and stops
// its deadline timer.
func (c *Controller) dequeue(e *entry) {
	q := &c.classes[e.class]
	q.remove(e)
	e.queued = false
	if e.timer != nil {
		e.timer.Stop()
	}
	c.queued--
	c.queuedTokens -= e.tokens
	if s := e.share; s != nil {
		s.n--
		s.tokens -= e.tokens
		if s.n == 0 {
			delete(c.shares, e.cost.Tenant)
		}
		e.share = nil
	}
	c.nQueued.Store(int64(c.queued))
	c.m.depth[e.class].Set(float64(q.n))
	c.m.tokens.Set(float64(c.queuedTokens))
}

// shareAllows reports whether the tenant may queue one more request of the
// given cost under TenantQueueShare: at most that fraction of
// MaxQueueRequests (at least one request) and of MaxQueueTokens (a tenant
// with nothing queued may always queue one request).
func (c *Controller) shareAllows(tenant string, tokens int64) bool {
	f := c.cfg.TenantQueueShare
	if f <= 0 {
		return true
	}
	s := c.shares[tenant]
	if s == nil {
		return true
	}
	if s.n+1 > max(int(f*float64(c.cfg.MaxQueueRequests)), 1) {
		return false
	}
	return c.cfg.MaxQueueTokens <= 0 || s.tokens+tokens <= int64(f*float64(c.cfg.MaxQueueTokens))
}

// makeRoom checks the queue's bounds for a new request of the class,
// evicting the newest requests of lower classes when that makes enough
// room, and only then. It reports the reason when there is no room.
func (c *Controller) makeRoom(class int, tokens int64) (Reason, bool) {
	maxN, maxT := c.cfg.MaxQueueRequests, c.cfg.MaxQueueTokens
	overN := func() bool { return c.queued+1 > maxN }
	overT := func() bool { return maxT > 0 && c.queuedTokens+tokens > maxT }
	if !overN() && !overT() {
		return 0, true
	}
	if maxT > 0 && tokens > maxT {
		return ReasonQueueTokens, false
	}
	var lowerN int
	var lowerT int64
	for i := range class {
		lowerN += c.classes[i].n
		lowerT += c.classes[i].tokens
	}
	switch {
	case overN() && lowerN == 0:
		return ReasonQueueFull, false
	case maxT > 0 && c.queuedTokens-lowerT+tokens > maxT:
		if overN() {
			return ReasonQueueFull, false
		}
		return ReasonQueueTokens, false
	}
	for overN() || overT() {
		var victim *entry
		for i := range class {
			if victim = c.classes[i].tail; victim != nil {
				break
			}
		}
		c.dequeue(victim)
		victim.err = c.shed(ReasonEvicted, victim.class, 0)
		close(victim.ready)
	}
	return 0, true
}
