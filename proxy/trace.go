package proxy

import (
	"errors"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/gpurouter/gpurouter/tracing"
	"github.com/valyala/fasthttp"
)

// A request's spans (package tracing), reported from its one flow
// (flow.go) and its exchange's end (finish), whichever path serves it:
// the request span from the flow's begin, the admission wait, each pick
// and attempt, the relay, each migration hop. The engine request carries
// the open attempt's span as its parent: Inject on the goroutine path
// (send), header lines the request loop writes (sendRequest).
//
// While tracing is off x.tr is nil: each report below is one nil check,
// and the client's traceparent passes to the engine untouched
// (forwardedHeaders). A request sampled out keeps its trace context for
// the engine and reports nothing else (Recording is false).

// traceStart starts the request's span, once, when tracing is on: from
// begin once the request is planned, or from its end when it ends before
// that (a missing key, a bad body), so that every request has its span.
func (f *flow) traceStart() {
	x := f.x
	if x.tr != nil || !f.s.tracer.Enabled() {
		return
	}
	info := tracing.RequestInfo{ID: x.id, Method: fasthttp.MethodPost, Path: string(f.ctx.Path()),
		Operation: operationOf(x.ep), Model: x.req.Model, Stream: x.req.Stream, MaxTokens: x.req.MaxTokens,
		EstimatedInputTokens: x.cost.PromptTokens, Priority: x.cost.Class, Tenant: x.cost.Tenant}
	if p := x.pool(); p != nil {
		info.Pool = p.Model()
	}
	x.tr = f.s.tracer.StartRequest(&f.ctx.Request.Header, info, x.received)
}

// operationOf is an endpoint's gen_ai.operation.name.
func operationOf(ep openai.Endpoint) tracing.Operation {
	switch ep {
	case openai.Chat:
		return tracing.OperationChat
	case openai.Completions:
		return tracing.OperationTextCompletion
	case openai.Embeddings:
		return tracing.OperationEmbeddings
	}
	return ""
}

// traceQueued starts the admission wait of a request that could not be
// admitted at once: where it joined the queue and why it could not go
// (the pool full, or others already waiting, who go first).
func (f *flow) traceQueued() {
	x := f.x
	if !x.tr.Recording() {
		return
	}
	n := x.route.Admission.Queued()
	reason := "saturated"
	if n > 0 {
		reason = "queue_not_empty"
	}
	x.tr.QueueStart(f.s.now(), tracing.Queued{Position: n, Length: n + 1, Reason: reason, CostTokens: x.cost.Tokens()})
}

// traceAdmitted ends the admission wait: admitted (err nil), or the
// outcome that ended it (shed, canceled, shutdown).
func (f *flow) traceAdmitted(err error) {
	x := f.x
	if !x.tr.Recording() {
		return
	}
	at, why := x.admitted, "admitted"
	if at.IsZero() {
		at = f.s.now()
	}
	if err != nil {
		o, _ := outcomeOf(err, statusOf(err))
		why = o.String()
	}
	x.tr.QueueEnd(at, why)
}

// tracePick records the pick that began at start and chose rep (nil:
// none): the policy, the replica and what it was expected to do with the
// request — the prompt tokens its prefix cache holds, its predicted TTFT
// for the rest of the prompt and its TPOT.
func (f *flow) tracePick(start time.Time, rep *balancer.Replica) {
	x := f.x
	now := f.s.now()
	p := tracing.Pick{Policy: x.route.Pool.Policy()}
	if f.pick.Arm != p.Policy {
		p.Arm = f.pick.Arm
	}
	if rep != nil {
		p.Replica = rep.Name()
		p.CachedTokens = f.pick.CachedTokens(rep)
		p.PredictedTTFT, p.PredictedTPOT = rep.Predict(max(x.cost.PromptTokens-p.CachedTokens, 0), now)
	}
	x.tr.Picked(start, now, p)
}

// traceAttempt starts the attempt on rep that next sends.
func (f *flow) traceAttempt(rep *balancer.Replica) {
	if f.x.tr.Recording() {
		f.x.tr.AttemptStart(f.x.sent, tracing.Attempt{Replica: rep.Name(), Address: rep.Addr()})
	}
}

// traceAttemptEnd ends an attempt that did not answer the request — it
// failed with err before its answer's head, or the engine refused with
// status — and says why another replica is tried, while one may be.
func (f *flow) traceAttemptEnd(status int, err error) {
	x := f.x
	if !x.tr.Recording() {
		return
	}
	why := attemptFailure(status, err)
	res := tracing.AttemptResult{Status: status, ErrorType: why}
	if int(x.attempts-f.from) < f.s.cfg.MaxAttempts {
		res.RetryReason = why
	}
	x.tr.AttemptEnd(f.s.now(), res)
}

// attemptFailure is an attempt's failure in a word: the engine's status
// when it refused, else as the retries metric labels it, or unreachable.
func attemptFailure(status int, err error) string {
	switch {
	case status != 0:
		return strconv.Itoa(status)
	case errors.Is(err, errUnreachable):
		return "unreachable"
	}
	return retryReason(err)
}

// traceFirstByte marks the engine's answer arriving, with its status.
func (f *flow) traceFirstByte(status int) {
	if f.x.tr.Recording() {
		f.x.tr.AttemptFirstByte(f.s.now(), status)
	}
}

// traceAbandoned ends the attempt in progress, given up for cause.
func (f *flow) traceAbandoned(cause error) {
	x := f.x
	if !x.tr.Recording() {
		return
	}
	o, _ := outcomeOf(cause, statusOf(cause))
	x.tr.AttemptEnd(f.s.now(), tracing.AttemptResult{ErrorType: o.String()})
}

// traceMigration starts hop, the stream's move off replica from after
// cause broke it: the attempt that served it until now ends.
func (x *exchange) traceMigration(hop int, from string, cause error) {
	if !x.tr.Recording() {
		return
	}
	now := x.s.now()
	why := "broken_stream"
	switch {
	case errors.Is(cause, errLeaving):
		why = "drained"
	case errors.Is(cause, ErrTimeout):
		why = "timeout"
	}
	x.tr.AttemptEnd(now, tracing.AttemptResult{Status: fasthttp.StatusOK, ErrorType: why})
	x.tr.MigrationStart(now, tracing.Migration{Hop: hop, From: from, Reason: why, RelayedTokens: int(x.tokenChunks)})
}

// traceMoved ends the hop: continued on replica to, or not (why).
func (x *exchange) traceMoved(to, why string) {
	if x.tr.Recording() {
		x.tr.MigrationEnd(x.s.now(), to, why)
	}
}

// traceEnd ends the request's spans at end: the relay with what it
// measured (as the metrics do), then the request with how it ended.
func (x *exchange) traceEnd(end time.Time) {
	if x.tr == nil {
		return
	}
	res := tracing.Result{Status: int(x.status), Outcome: x.outcome.String(),
		Usage: tracing.Usage{InputTokens: int(x.promptTokens), OutputTokens: int(x.completionTokens)}}
	if x.tr.Recording() {
		x.tr.RelayEnd(end, x.relayStats())
		switch x.outcome {
		case outcomeNoReplica, outcomeUpstreamError, outcomeBrokenStream, outcomeTimeout, outcomeShutdown:
			res.ErrorType = x.outcome.String()
		}
	}
	x.tr.End(end, res)
}

// relayStats is what the relay measured of the answer.
func (x *exchange) relayStats() tracing.Relay {
	s := tracing.Relay{TTFT: sinceOr(x.firstTok, x.received), Chunks: int(x.tokenChunks), OutputTokens: int(x.completionTokens),
		ITLCount: int(x.itlCount), ITLMax: x.itlMax, ClientGone: x.outcome == outcomeCanceled}
	if x.itlCount > 0 {
		s.ITLMean = x.itlSum / time.Duration(x.itlCount)
	}
	if x.completionTokens > 1 && !x.firstTok.IsZero() {
		s.TPOT = x.lastTok.Sub(x.firstTok) / time.Duration(x.completionTokens-1)
	}
	if x.status == fasthttp.StatusOK && !x.outcome.served() && !s.ClientGone {
		s.ErrorType = x.outcome.String() // the stream ended early: an error event
	}
	return s
}
