package balancer

import "time"

// Passive health: what the router learns about a replica from the traffic
// it sends, between active health checks. Two signals, neither of which
// counts against the circuit breaker:
//
//   - A refusal (the engine answered 429 or 503, its queue full): the
//     replica rests — pickers skip it and admission counts it saturated —
//     until its Retry-After passes or a scrape shows its queue draining.
//   - An unreachable replica (the connection was refused: the process is
//     gone): it is marked down at once, as Envoy's outlier detection does
//     on connect failures; the active health checker brings it back.

// MaxRest bounds how long a refusal's Retry-After can keep a replica out
// of rotation: an engine asking for an hour must not take itself out of a
// pool for that long on one answer.
const MaxRest = time.Minute

// Rest takes the replica out of rotation until until (at most MaxRest
// from now), because it refused a request for lack of room. A longer rest
// already in force is kept.
func (r *Replica) Rest(now, until time.Time) {
	until = minTime(until, now.Add(MaxRest))
	n := until.UnixNano()
	r.restFrom.Store(now.UnixNano())
	waiting := int64(-1)
	if e := r.tel.engine.Load(); e != nil {
		waiting = int64(e.Waiting)
	}
	r.restWaiting.Store(waiting)
	for {
		cur := r.restUntil.Load()
		if cur >= n || r.restUntil.CompareAndSwap(cur, n) {
			return
		}
	}
}

// Resting reports whether the replica refused a request and asked for a
// pause that has not ended at now.
// Pickers ask it of every candidate: the common case (never refused) is
// one atomic load, inlined.
func (r *Replica) Resting(now time.Time) bool {
	u := r.restUntil.Load()
	return u != 0 && r.restingAt(now, u)
}

func (r *Replica) restingAt(now time.Time, until int64) bool {
	if now.IsZero() { // as Available: the zero time means the replica's clock
		now = r.now()
	}
	return now.UnixNano() < until
}

// RestUntil is when the replica's rest ends (zero when it is not resting
// at now).
func (r *Replica) RestUntil(now time.Time) time.Time {
	if !r.Resting(now) {
		return time.Time{}
	}
	return time.Unix(0, r.restUntil.Load())
}

// endRestIfRoom ends a rest early when a scrape taken after it began shows
// the engine's queue shorter than the last scrape before the refusal did:
// the room the refusal said was missing is coming back. An engine that
// refuses with its queue empty (a rate limit of its own) or whose queue
// was unknown rests its whole Retry-After.
func (r *Replica) endRestIfRoom(l *EngineLoad) {
	u := r.restUntil.Load()
	if u == 0 || l.At.IsZero() || l.At.UnixNano() <= r.restFrom.Load() {
		return
	}
	if int64(l.Waiting) < r.restWaiting.Load() {
		r.restUntil.CompareAndSwap(u, 0)
	}
}

// MarkDown takes the replica out of rotation because it could not be
// reached (connection refused), until the active health checker sees it
// healthy again. It reports whether the replica was healthy before, so the
// caller logs the change once.
func (r *Replica) MarkDown() bool { return r.healthy.Swap(false) }

// RestEnds reports whether every available replica of the pool is resting
// after a refusal and, if so, when the first rest ends: a client is told
// to come back then.
func (p *Pool) RestEnds(now time.Time) (time.Time, bool) {
	var first time.Time
	for _, r := range *p.replicas.Load() {
		if !r.Available(now) {
			continue
		}
		u := r.RestUntil(now)
		if u.IsZero() {
			return time.Time{}, false // this one has room
		}
		if first.IsZero() || u.Before(first) {
			first = u
		}
	}
	return first, !first.IsZero()
}

// DefaultMaxEjectionPercent is PoolConfig.MaxEjectionPercent's default.
const DefaultMaxEjectionPercent = 50

// mayEject reports whether r's breaker may open: the replicas of the pool
// whose breakers are open stay within MaxEjectionPercent of the pool (at
// least one may always be ejected, as in Envoy). Consecutive failures
// spread over most of a pool say more about the traffic or the router
// than about the replicas, and ejecting them all would leave nothing.
func (p *Pool) mayEject(r *Replica, now time.Time) bool {
	rs := *p.replicas.Load()
	pct := p.cfg.MaxEjectionPercent
	switch {
	case pct == 0:
		pct = DefaultMaxEjectionPercent
	case pct < 0 || pct >= 100:
		return true
	}
	allowed := max(1, int(float64(len(rs))*pct/100))
	ejected := 0
	n := now.UnixNano()
	for _, o := range rs {
		if o != r && o.openUntil.Load() > n {
			ejected++
		}
	}
	return ejected < allowed
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
