package proxy

import (
	"github.com/gpurouter/gpurouter/proxy/observe"
	"time"
)

// What a finished exchange leaves to be read later: its record
// (/debug/requests, the status page; observe.Record) and its queue time.

func (x *exchange) record(end time.Time) observe.Record {
	r := observe.Record{
		RequestID:        x.id,
		Status:           int(x.status),
		Outcome:          x.outcome.String(),
		Stream:           x.req.Stream,
		Attempts:         int(x.attempts),
		ReceivedNs:       unixNs(x.received),
		AdmittedNs:       unixNs(x.admittedAt()),
		FirstByteNs:      unixNs(x.firstByte),
		FirstTokenNs:     unixNs(x.firstTok),
		DoneNs:           unixNs(end),
		E2ES:             end.Sub(x.received).Seconds(),
		ITLCount:         int(x.itlCount),
		PromptTokens:     int(x.promptTokens),
		CompletionTokens: int(x.completionTokens),
		EstPromptTokens:  x.cost.PromptTokens,
	}
	if p := x.pool(); p != nil {
		r.Model = p.Model()
	}
	if x.last != nil {
		r.Replica = x.last.Name()
	}
	if a := x.admittedAt(); !a.IsZero() {
		r.QueueS = a.Sub(x.received).Seconds()
	}
	if !x.firstTok.IsZero() {
		r.TTFTS = x.firstTok.Sub(x.received).Seconds()
		if !x.sent.IsZero() && x.sent.Before(x.firstTok) {
			r.PlacedTTFTS = x.firstTok.Sub(x.sent).Seconds()
			r.PredictedTTFTS = x.lease.PredictedTTFT().Seconds()
		}
	}
	if x.itlCount > 0 {
		r.ITLMeanS = x.itlSum.Seconds() / float64(x.itlCount)
		r.ITLMaxS = x.itlMax.Seconds()
	}
	x.mig.recordInto(&r)
	x.pd.recordInto(&r, x)
	return r
}

// admittedAt is when the request left the router's queue: admission's
// verdict, or (without admission) when it was handed to the upstream.
func (x *exchange) admittedAt() time.Time {
	if !x.admitted.IsZero() {
		return x.admitted
	}
	return x.sent
}

func unixNs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// recordGap counts one inter-token gap at now in the replica that sent it.
func (x *exchange) recordGap(now time.Time, gap time.Duration) {
	if x.up != nil {
		x.up.lat.Gap(now, gap)
	}
}

// recordQueue counts the request's router queue time (received →
// admitted) at admitted, in the replica that answered, or in its pool's
// replica "" when none did.
func (x *exchange) recordQueue(admitted time.Time) {
	q := admitted.Sub(x.received)
	if x.up != nil {
		x.up.lat.Queued(admitted, q)
		return
	}
	x.s.lat.Replica(x.route.Pool.Model(), "").Queued(admitted, q)
}
