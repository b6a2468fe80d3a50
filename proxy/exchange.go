package proxy

import (
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/gpurouter/gpurouter/proxy/auth"
	"github.com/gpurouter/gpurouter/proxy/observe"
	"github.com/gpurouter/gpurouter/tracing"
	"go.uber.org/zap"
)

// outcome is how a request ended, in a few low-cardinality words for metric
// labels and logs.
type outcome uint8

const (
	outcomeOK            outcome = iota // served, stream ended with [DONE]
	outcomeClientError                  // 4xx: the client's request was refused (by the router or the engine)
	outcomeCanceled                     // the client went away (499)
	outcomeNoReplica                    // no healthy replica (503)
	outcomeShed                         // refused by admission (429)
	outcomeUpstreamError                // the engine failed: 5xx, bad body, error event
	outcomeBrokenStream                 // the stream ended without [DONE]
	outcomeTimeout                      // first-byte, idle or total deadline hit
	outcomeShutdown                     // aborted by router shutdown
	outcomeRateLimited                  // refused by the API key's rate limit (429)
	outcomeMigrated                     // served to the end, continued on another replica after its own failed (migrate.go)
)

var outcomeNames = [...]string{"ok", "client_error", "canceled", "no_replica", "shed", "upstream_error", "broken_stream", "timeout", "shutdown", "rate_limited", "migrated"}

// served reports an outcome whose client got the whole answer.
func (o outcome) served() bool { return o == outcomeOK || o == outcomeMigrated }

func (o outcome) String() string { return outcomeNames[o] }

// exchange is one request's journey through the router: what was asked,
// where it went, and when each thing happened. It lives from the handler
// until the response stream closes, and is finished exactly once. Each
// group of fields is written by one step of the request (flow.go)
// and only read after it.
type exchange struct {
	s   *Server
	id  string
	seq uint64 // the router's own number for the request (unique, unlike a client-chosen id); set by upstreamRequest
	ep  openai.Endpoint
	// Step 7's, beside ep: the exchange keeps to its size class
	// (size_test.go).
	outcome  outcome
	gotUsage bool      // usage came from the engine (step 6)
	status   int32     // the answer's status (step 7), in the padding after the bytes above
	received time.Time // full request read by the router
	// tr is the request's spans (trace.go); nil while tracing is off.
	tr *tracing.Request

	// Steps 1–2 (flow.go, plan.go, clients.go): the request, its client and
	// pool, and its cost — computed once, read by admission, the lease
	// and the record.
	req       openai.Request
	route     *poolRoute
	cost      admission.Cost
	arm       string         // A/B arm (the policy name outside experiments); the picker may set it in step 4
	affinity  string         // session key: X-Session-Id, else the body's user
	principal auth.Principal // the client's API key; zero when auth is off or no valid key came
	prompt    *promptText    // the prompt as prefix indexes key it, its keys and hits (prefix.go); nil when no pool has an index
	keys      *auth.KeyStore // the store that authenticated principal; nil when auth is off

	// Step 3 (admit.go): the admission ticket; zero without admission.
	ticket   admission.Ticket
	admitted time.Time // admission let it through (zero without admission)

	// Steps 4–5 (flow.go, forward.go): the replica that answered.
	up        *upstream         // nil if none did
	last      *balancer.Replica // the replica the request was last sent to (nil if none)
	rm        *replicaMetrics   // up's metric children for the request's arm
	lease     balancer.Lease
	sent      time.Time // last attempt handed to the upstream client
	firstByte time.Time // upstream response headers read
	// upc is the connection the response came on, when it is one a
	// stream's relay may take from fasthttp (pump_linux.go); else nil.
	upc *deadlineConn

	// Step 6 (relay.go, respond.go): tokens as they came.
	firstTok time.Time // first token chunk relayed
	lastTok  time.Time // last token chunk relayed
	itlSum   time.Duration
	itlMax   time.Duration
	// int32, side by side: the exchange stays within its 704-byte size
	// class, malloc header included (one word more costs 64 B a request).
	itlCount         int32
	tokenChunks      int32
	promptTokens     int32 // from the engine's usage (0 if none came)
	completionTokens int32

	// Steps 5–6 (migrate.go): what continuing the stream on another
	// replica needs; nil when the request may not be continued.
	mig *migration
	// Steps 4–5 of a split request (disagg.go): its prefill; nil when the
	// request was not split.
	pd *pdRecord

	// Step 7 (finish). status and done side by side: the exchange keeps
	// to its size class (size_test.go).
	attempts int32 // steps 4–5's attempts, here to keep the size class
	done     atomic.Bool
	err      error
}

// pool is the pool the request was routed to; nil before step 2.
func (x *exchange) pool() *balancer.Pool {
	if x.route == nil {
		return nil
	}
	return x.route.Pool
}

// leaseCost is what the request holds on the replica it is placed on,
// all from its one cost: the work in decode-token equivalents (the
// prompt weighted as the balancer weighs prefill, plus the output), the
// KV footprint and whether it is a long prefill — both reserved only
// under admission, whose saturation rule reads them.
func (x *exchange) leaseCost() (work, kv int64, long bool) {
	work = x.prefillWork() + int64(max(x.cost.OutputTokens, 0))
	if x.ticket.Admitted() {
		kv = max(x.cost.Tokens()-int64(x.prompt.cachedTokens()), 0)
		long = x.ticket.LongPrefillCap() > 0 && !x.pd.remoteKV()
	}
	return work, kv, long
}

// prefillWork is the prompt's share of the lease, handed back when the
// first token arrives.
func (x *exchange) prefillWork() int64 { return x.s.score.Cost(x.leasePrompt(), 0) }

// uncached is the prompt tokens the replica placed on must prefill: the
// prompt less what its prefix cache holds.
func (x *exchange) uncached() int { return max(x.cost.PromptTokens-x.prompt.cachedTokens(), 0) }

// tokenChunk records the arrival of a chunk carrying output.
func (x *exchange) tokenChunk(now time.Time) {
	x.tokenChunks++
	if x.firstTok.IsZero() {
		x.firstTok = now
		if x.rm != nil {
			x.rm.ttft.Observe(now.Sub(x.received).Seconds())
		}
		x.tr.FirstToken(now)
		x.lease.Progress(x.prefillWork())
		x.lease.PrefillDone()
		// The replica's queued prefill just shrank (a saturation signal):
		// a request held at the router may fit now. Free when none waits.
		if x.route != nil && x.route.Admission != nil {
			x.route.Admission.Poke()
		}
	} else {
		gap := now.Sub(x.lastTok)
		x.itlCount++
		x.itlSum += gap
		x.itlMax = max(x.itlMax, gap)
		if x.rm != nil {
			x.rm.itl.Observe(gap.Seconds())
		}
		x.recordGap(now, gap)
		x.lease.ObserveGap(gap, now)
	}
	x.lease.Progress(1)
	x.lease.AliveAt(now)
	x.lastTok = now
}

// admissionWaiting reports whether requests wait in the admission queue of
// x's route: only then can x's first token let one out (tokenChunk).
func (x *exchange) admissionWaiting() bool {
	return x.route != nil && x.route.Admission != nil && x.route.Admission.Waiting()
}

// finish ends the exchange once: releases the replica, records metrics, the
// access log line and the debug record. err is the terminal error (nil for
// a clean end); status is what the client got.
func (x *exchange) finish(err error, status int) {
	if !x.done.CompareAndSwap(false, true) {
		return
	}
	end := x.s.now()
	x.status = int32(status)
	x.err = err
	var breakerErr error
	x.outcome, breakerErr = outcomeOf(err, status)
	x.outcome = x.mig.outcome(x.outcome)
	if x.up != nil {
		x.lease.Done(breakerErr)
	}
	x.releaseTicket()
	s := x.s
	// Out of the count last: once Active reads 0 (a drain's wait, a test),
	// every finished request's metrics, record and log line are written.
	defer s.active.Add(-1)

	model, replica := "", ""
	if p := x.pool(); p != nil {
		model = p.Model()
	}
	if x.last != nil {
		replica = x.last.Name()
	}
	if x.rm != nil && status == 200 && x.outcome == outcomeOK && x.rm.arm == x.arm && x.last == x.up.replica {
		x.rm.ok.Inc()
	} else {
		s.m.requests.WithLabelValues(model, replica, x.arm, statusText(status), x.outcome.String()).Inc()
	}

	e2eEnd := end
	if !x.lastTok.IsZero() {
		e2eEnd = x.lastTok // as vllm bench: the last token chunk, not [DONE]
	}
	if x.rm != nil && x.outcome.served() {
		x.rm.e2e.Observe(e2eEnd.Sub(x.received).Seconds())
		if x.gotUsage {
			x.rm.promptToks.Add(float64(x.promptTokens))
			x.rm.genToks.Add(float64(x.completionTokens))
		}
		// A migrated stream's decode spans two replicas and the pause
		// between them: not this replica's speed.
		if x.completionTokens > 1 && !x.firstTok.IsZero() && x.outcome == outcomeOK {
			decode := x.lastTok.Sub(x.firstTok)
			x.rm.tpot.Observe(decode.Seconds() / float64(x.completionTokens-1))
			x.lease.ObserveDecode(int(x.completionTokens), decode)
		}
	}
	x.pd.observe(s.m.pd, model, x)
	x.traceEnd(end)
	s.records.Add(x.record(e2eEnd))
	x.logLine(err, end, e2eEnd, model, replica)
}

// logLine writes the exchange's access log line: the common kind straight
// (observe.AccessLog), the others through zap.
func (x *exchange) logLine(err error, end, e2eEnd time.Time, model, replica string) {
	s := x.s
	if err == nil && (x.mig == nil || x.mig.migrations == 0) {
		// The common kind, with no error to report and no migration.
		line := observe.Line{ID: x.id, Endpoint: x.ep.String(), Model: model, Replica: replica, Arm: x.arm, KeyID: x.principal.ID,
			Status: int(x.status), Outcome: x.outcome.String(), Stream: x.req.Stream, Attempts: int(x.attempts),
			TTFT: sinceOr(x.firstTok, x.received), E2E: e2eEnd.Sub(x.received), PromptTokens: int(x.promptTokens),
			CompletionTokens: int(x.completionTokens), End: end}
		if s.access.Write(&line) {
			return
		}
	}
	if ce := s.log.Check(zap.InfoLevel, "request"); ce != nil {
		keyID := zap.Skip() // the key's id only, never the key
		if x.principal.ID != "" {
			keyID = zap.String("key_id", x.principal.ID)
		}
		f := s.accessFields.Get().(*accessFields)
		*f = accessFields{
			zap.String("request_id", x.id),
			zap.String("endpoint", x.ep.String()),
			zap.String("model", model),
			zap.String("replica", replica),
			zap.String("arm", x.arm),
			keyID,
			zap.Int("status", int(x.status)),
			zap.String("outcome", x.outcome.String()),
			zap.Bool("stream", x.req.Stream),
			zap.Int("attempts", int(x.attempts)),
			zap.Duration("ttft", sinceOr(x.firstTok, x.received)),
			zap.Duration("e2e", e2eEnd.Sub(x.received)),
			zap.Int("prompt_tokens", int(x.promptTokens)),
			zap.Int("completion_tokens", int(x.completionTokens)),
			zap.NamedError("error", errOrNil(err, x.outcome)),
			causeOf(err),
			x.mig.logField(),
		}
		ce.Write(f[:]...)
		*f = accessFields{} // the pool holds no request's strings or errors
		s.accessFields.Put(f)
	}
}

// accessFields are the fields of an access log line that goes through zap
// (observe.AccessLog writes the common ones itself). Passed to zap as a literal
// list they would be a 1,152-byte heap slice a line — zap's cores are
// interfaces, so the slice escapes. Server.accessFields pools them: a zap
// core encodes the fields it is given before Write returns, and keeps none
// (a core that keeps them, as zaptest's observer does, copies them).
type accessFields [17]zap.Field

// causeOf is the library error behind a failure whose client-facing
// words leave it out: the log keeps what the client is not shown.
func causeOf(err error) zap.Field {
	if err == nil {
		return zap.Skip() // before f, which errors.As makes a heap object
	}
	var f *upstreamFailure
	if errors.As(err, &f) && f.cause != nil {
		return zap.NamedError("cause", f.cause)
	}
	return zap.Skip()
}

func sinceOr(t, from time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return t.Sub(from)
}

func errOrNil(err error, o outcome) error {
	if o.served() {
		return nil
	}
	return err
}

func statusText(status int) string {
	switch status {
	case 200:
		return "200"
	case 0:
		return "0"
	}
	return strconv.Itoa(status)
}
