package balancer

import (
	"math"
	"time"
)

// Other routers' traffic. Router replicas share no state: each corrects an
// engine's last scraped load by what it sent there itself since, and sees
// the other routers' sends only at the next scrape — meanwhile all of them
// would take the replica that looked idlest. Two consecutive scrapes tell
// how many requests arrived at the replica in between (the engine's
// finished counter grew by some, its running and waiting by the rest);
// the router knows how many of those it sent; the difference is the
// others' traffic. Its rate, kept per replica, lets the scorers count the
// others' expected sends since the scrape as they count their own.

// othersTau is the time constant of the others' arrival-rate EWMA: a few
// 200 ms scrapes, so one interval's Poisson noise is smoothed while a
// shift of traffic between replicas shows within about a second.
const othersTau = time.Second

// peerTraffic updates l (the new snapshot) with the others' arrival rate
// from prev (the previous one, nil for the first), own (the requests this
// router sent to the replica between them) and inFlight (its requests in
// flight now). A request the router counted as sent but the engine had
// not yet seen at the scrape shows as a deficit; it is carried to the next
// interval, where the engine counts it, rather than read as the others
// sending less. Only a request sent in the interval and still in flight
// can be on its way, so the deficit carried is at most the fewer of own
// and inFlight, and lasts one interval: a request lost before reaching
// the engine hides at most one of the others' for one interval. With one
// router the estimate stays 0.
func peerTraffic(l, prev *EngineLoad, own, inFlight int64) {
	if prev == nil || !l.FinishedKnown || !prev.FinishedKnown {
		return
	}
	l.OthersPerS, l.othersCarry = prev.OthersPerS, prev.othersCarry
	dt := l.At.Sub(prev.At)
	if dt <= 0 {
		return
	}
	if l.RequestsFinished < prev.RequestsFinished { // the engine restarted
		l.othersCarry = 0
		return
	}
	arrived := float64(l.RequestsFinished-prev.RequestsFinished) +
		float64(l.Running+l.Waiting) - float64(prev.Running+prev.Waiting)
	excess := arrived - float64(own) + prev.othersCarry
	others := max(excess, 0)
	l.othersCarry = max(min(excess, 0), -float64(max(min(own, inFlight), 0)))
	w := 1 - math.Exp(-dt.Seconds()/othersTau.Seconds())
	l.OthersPerS = prev.OthersPerS + w*(others/dt.Seconds()-prev.OthersPerS)
}

// othersSince is how many requests the other routers are expected to have
// sent to the replica since e was scraped, at now: their arrival rate
// times the snapshot's age (0 for a nil snapshot or a clock behind it).
func othersSince(e *EngineLoad, now time.Time) float64 {
	if e == nil || e.OthersPerS <= 0 {
		return 0
	}
	return e.OthersPerS * max(now.Sub(e.At).Seconds(), 0)
}
