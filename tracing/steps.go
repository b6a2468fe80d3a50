package tracing

import (
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The steps of a request, each a span under the request's, in the order
// the router takes them (DESIGN.md, "One request, top to bottom").

// Queued is why and where a request waits for admission. A zero Length,
// Reason or CostTokens is left out.
type Queued struct {
	Position   int    // requests ahead of it when it joined the queue (0: at the head)
	Length     int    // requests waiting then, itself included
	Reason     string // why it could not go at once: saturated, max_in_flight, tenant_share, ...
	CostTokens int64  // the work admission charged it, in tokens
}

// QueueStart starts the admission wait of a request that could not be
// admitted at once (one admitted at once has no wait span).
func (r *Request) QueueStart(at time.Time, q Queued) {
	if r.live() {
		r.queueStart(at, q)
	}
}

func (r *Request) queueStart(at time.Time, q Queued) {
	if r.queue != nil {
		r.QueueEnd(at, "requeued")
	}
	a := make([]attribute.KeyValue, 0, 4)
	a = append(a, AttrQueuePosition.Int(q.Position))
	a = appendInt(a, AttrQueueLength, q.Length)
	a = appendString(a, AttrQueueReason, q.Reason)
	if q.CostTokens != 0 {
		a = append(a, AttrQueueCost.Int64(q.CostTokens))
	}
	r.queue = r.start(SpanAdmission, trace.SpanKindInternal, at, a)
}

// QueueEnd ends the admission wait: outcome "admitted", or why the
// request left the queue without being admitted (shed, queue_full,
// deadline, canceled, ...), which marks the span failed.
func (r *Request) QueueEnd(at time.Time, outcome string) {
	if r.live() {
		r.queueEnd(at, outcome)
	}
}

func (r *Request) queueEnd(at time.Time, outcome string) {
	if r.queue == nil {
		return
	}
	a := []attribute.KeyValue{AttrQueueOutcome.String(outcome)}
	setError(r.queue, a, outcome, outcome != "admitted")
	endSpan(&r.queue, at)
}

// Pick is one decision of the balancer: the replica it chose for the next
// attempt and what it expected of it. A zero field is left out.
type Pick struct {
	Policy     string
	Arm        string // the A/B arm, when the pool runs an experiment
	Replica    string // "" when no replica could take the request
	Candidates int    // replicas it chose among
	// CachedTokens are the prompt tokens the replica was expected to hold
	// in its prefix cache.
	CachedTokens  int
	PredictedTTFT time.Duration
	PredictedTPOT time.Duration
	Reason        string // why this replica, or why none
}

// Picked records a pick that ran from start to end, for the attempt that
// follows it. A pick without a replica is a failed span (error.type
// no_replica).
func (r *Request) Picked(start, end time.Time, p Pick) {
	if r.live() {
		r.picked(start, end, p)
	}
}

func (r *Request) picked(start, end time.Time, p Pick) {
	a := make([]attribute.KeyValue, 0, 10)
	a = appendString(a, AttrPolicy, p.Policy)
	a = appendString(a, AttrArm, p.Arm)
	a = append(a, AttrReplica.String(p.Replica), AttrAttempt.Int(r.attempts+1))
	a = appendInt(a, AttrCandidates, p.Candidates)
	a = appendInt(a, AttrPickCached, p.CachedTokens)
	a = appendSeconds(a, AttrPredictedTTFT, p.PredictedTTFT)
	a = appendSeconds(a, AttrPredictedTPOT, p.PredictedTPOT)
	a = appendString(a, AttrPickReason, p.Reason)
	s := r.start(SpanPick, trace.SpanKindInternal, start, nil)
	setError(s, a, "no_replica", p.Replica == "")
	s.End(trace.WithTimestamp(end))
}

// Attempt is one try of the request on a replica. A zero field is left
// out.
type Attempt struct {
	Replica string // the replica's name
	Address string // its host:port: server.address and server.port
}

// AttemptStart starts an attempt: the GenAI client span the engine's own
// span (vLLM's llm_request) continues under, once Inject or
// AppendHeaderLines has put it into the engine request. An attempt
// started while one is open ends that one first.
func (r *Request) AttemptStart(at time.Time, try Attempt) {
	if r.live() {
		r.attemptStart(at, try)
	}
}

func (r *Request) attemptStart(at time.Time, try Attempt) {
	if r.attempt != nil {
		r.AttemptEnd(at, AttemptResult{ErrorType: "superseded"})
	}
	r.attempts++
	a := make([]attribute.KeyValue, 0, 10)
	a = appendString(a, AttrOperation, string(r.op))
	a = appendString(a, AttrProvider, r.provider)
	a = appendString(a, AttrRequestModel, r.model)
	a = appendServer(a, try.Address)
	a = appendString(a, AttrReplica, try.Replica)
	a = append(a, AttrAttempt.Int(r.attempts))
	a = appendInt(a, AttrResendCount, r.attempts-1)
	a = appendInt(a, AttrHop, r.hop)
	r.attempt = r.start(clientSpanName(r.op, r.model), trace.SpanKindClient, at, a)
}

func clientSpanName(op Operation, model string) string {
	switch {
	case op == "":
		return "inference"
	case model == "":
		return string(op)
	}
	return string(op) + " " + model
}

// AttemptConnected marks the attempt's connection to the replica up (a
// kept-alive one as soon as it is taken).
func (r *Request) AttemptConnected(at time.Time) {
	if r.live() {
		r.attemptConnected(at)
	}
}

func (r *Request) attemptConnected(at time.Time) {
	if r.attempt == nil {
		return
	}
	r.attempt.AddEvent(EventConnected, trace.WithTimestamp(at))
}

// AttemptFirstByte marks the engine's response head arriving, with its
// status.
func (r *Request) AttemptFirstByte(at time.Time, status int) {
	if r.live() {
		r.attemptFirstByte(at, status)
	}
}

func (r *Request) attemptFirstByte(at time.Time, status int) {
	if r.attempt == nil {
		return
	}
	r.attempt.AddEvent(EventFirstByte, trace.WithTimestamp(at))
	r.attempt.SetAttributes(AttrHTTPStatus.Int(status))
}

// AttemptResult is how an attempt ended; the zero value is an attempt
// that ended without a response and without an error of its own (the
// request ended first).
type AttemptResult struct {
	Status int // the engine's HTTP status; 0 when none came
	// ErrorType is a low-cardinality cause when the attempt failed
	// (connect, timeout, reset, bad_response, ...); "" = it did not, and a
	// status of 400 or more is then the cause.
	ErrorType string
	// RetryReason says why the router tries again after this attempt; ""
	// when it does not.
	RetryReason string
	// Usage is the engine's, when this attempt served the response.
	Usage Usage
}

// AttemptEnd ends the open attempt.
func (r *Request) AttemptEnd(at time.Time, res AttemptResult) {
	if r.live() {
		r.attemptEnd(at, res)
	}
}

func (r *Request) attemptEnd(at time.Time, res AttemptResult) {
	if r.attempt == nil {
		return
	}
	a := make([]attribute.KeyValue, 0, 10)
	a = appendInt(a, AttrHTTPStatus, res.Status)
	a = appendString(a, AttrRetryReason, res.RetryReason)
	a = res.Usage.attrs(a)
	errType := res.ErrorType
	if errType == "" && res.Status >= 400 {
		errType = strconv.Itoa(res.Status)
	}
	setError(r.attempt, a, errType, errType != "")
	endSpan(&r.attempt, at)
}

// RelayStart starts the relay of the response to the client (the engine's
// head has arrived). A stream that moves keeps its one relay.
func (r *Request) RelayStart(at time.Time) {
	if r.live() {
		r.relayStart(at)
	}
}

func (r *Request) relayStart(at time.Time) {
	if r.relay != nil {
		return
	}
	r.relay = r.start(SpanRelay, trace.SpanKindInternal, at, nil)
}

// FirstToken marks the first content chunk reaching the client.
func (r *Request) FirstToken(at time.Time) {
	if r.live() {
		r.firstToken(at)
	}
}

func (r *Request) firstToken(at time.Time) {
	if r.relay == nil {
		return
	}
	r.relay.AddEvent(EventFirstToken, trace.WithTimestamp(at))
}

// Relay is what the relay measured, as the router's metrics do (TTFT from
// the request's receipt, TPOT and inter-token gaps between content
// chunks). A zero field is left out.
type Relay struct {
	TTFT         time.Duration
	TPOT         time.Duration
	Chunks       int
	OutputTokens int
	ITLCount     int
	ITLMean      time.Duration
	ITLMax       time.Duration
	// ClientGone: the client left before the response ended (a failure
	// of the relay, error.type client_gone).
	ClientGone bool
	// ErrorType is why the stream ended early otherwise (the error event
	// the client got); "" = it did not.
	ErrorType string
}

// RelayEnd ends the relay.
func (r *Request) RelayEnd(at time.Time, s Relay) {
	if r.live() {
		r.relayEnd(at, s)
	}
}

func (r *Request) relayEnd(at time.Time, s Relay) {
	if r.relay == nil {
		return
	}
	a := make([]attribute.KeyValue, 0, 8)
	a = appendSeconds(a, AttrTTFT, s.TTFT)
	a = appendSeconds(a, AttrTPOT, s.TPOT)
	a = appendInt(a, AttrChunks, s.Chunks)
	a = appendInt(a, AttrRelayOut, s.OutputTokens)
	a = appendInt(a, AttrITLCount, s.ITLCount)
	a = appendSeconds(a, AttrITLMean, s.ITLMean)
	a = appendSeconds(a, AttrITLMax, s.ITLMax)
	errType := s.ErrorType
	if s.ClientGone {
		a = append(a, AttrClientGone.Bool(true))
		if errType == "" {
			errType = "client_gone"
		}
	}
	setError(r.relay, a, errType, errType != "")
	endSpan(&r.relay, at)
}

// Migration is one move of a stream from a replica that failed (or was
// drained) to another. A zero From or Reason is left out.
type Migration struct {
	Hop           int    // 1 for the stream's first move
	From          string // the replica it leaves
	Reason        string // why: reset, timeout, drained, ...
	RelayedTokens int    // output tokens the client had when it moved
}

// MigrationStart starts a hop at the moment the stream broke; the pick
// and attempt that continue it follow, the attempt marked with the hop.
func (r *Request) MigrationStart(at time.Time, m Migration) {
	if r.live() {
		r.migrationStart(at, m)
	}
}

func (r *Request) migrationStart(at time.Time, m Migration) {
	if r.migration != nil {
		r.MigrationEnd(at, "", "superseded")
	}
	r.hop = m.Hop
	a := make([]attribute.KeyValue, 0, 4)
	a = append(a, AttrHop.Int(m.Hop))
	a = appendString(a, AttrHopFrom, m.From)
	a = appendString(a, AttrHopReason, m.Reason)
	a = append(a, AttrHopRelayed.Int(m.RelayedTokens))
	r.migration = r.start(SpanMigration, trace.SpanKindInternal, at, a)
}

// MigrationEnd ends the hop: the stream resumed on replica to (errorType
// ""), or could not be continued (errorType says why).
func (r *Request) MigrationEnd(at time.Time, to, errorType string) {
	if r.live() {
		r.migrationEnd(at, to, errorType)
	}
}

func (r *Request) migrationEnd(at time.Time, to, errorType string) {
	if r.migration == nil {
		return
	}
	a := appendString(make([]attribute.KeyValue, 0, 2), AttrHopTo, to)
	setError(r.migration, a, errorType, errorType != "")
	endSpan(&r.migration, at)
}
