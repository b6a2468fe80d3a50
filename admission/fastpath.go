package admission

// TryAdmit is Admit's path for a pool with room: the ticket at once when
// nothing is queued and the request fits, ok false otherwise — the caller
// then calls Admit, which queues it (or refuses it). It lets the router
// skip what only a wait needs (a cancelable context, a watch on the
// client) for the requests that never wait.
func (c *Controller) TryAdmit(cost Cost) (Ticket, bool) {
	tokens := cost.charge()
	c.mu.Lock()
	if c.queued != 0 || !c.fits(cost, tokens) {
		c.mu.Unlock()
		return Ticket{}, false
	}
	c.inFlight++
	c.outstanding += tokens
	longCap := c.longCap(cost)
	c.mu.Unlock()
	c.m.admittedNow.Inc()
	c.m.wait.Observe(0)
	return Ticket{c: c, cost: cost, tokens: tokens, longCap: longCap}, true
}
