package admission

import (
	"errors"
	"strconv"
	"time"
)

// Sentinel errors. Every refusal Admit returns is a *ShedError that matches
// ErrShed and exactly one of the narrower sentinels with errors.Is, so the
// proxy can map the whole family to 429 with one check. A client that goes
// away while queued gets its context's error instead, never ErrShed.
var (
	// ErrShed is the root of every refusal: the pool is saturated and the
	// request cannot wait for it.
	ErrShed = errors.New("admission: request shed")
	// ErrQueueFull means the queue's request or token bound (or the tenant's
	// share of it) left no room, or a higher-priority request displaced
	// this one.
	ErrQueueFull = errors.New("admission: queue full")
	// ErrDeadline means the request could not be admitted before its
	// deadline: refused at arrival because the estimated wait exceeds it, or
	// removed from the queue when it passed.
	ErrDeadline = errors.New("admission: deadline cannot be met")
)

// Reason is why a request was shed, in a few low-cardinality words for
// metric labels and logs.
type Reason uint8

// Reasons, each matching one sentinel (see ShedError.Unwrap).
const (
	ReasonQueueFull   Reason = iota // the queue holds MaxQueueRequests requests
	ReasonQueueTokens               // the queue would exceed MaxQueueTokens
	ReasonTenantShare               // the tenant holds its share of the queue
	ReasonEvicted                   // displaced from a full queue by a higher class
	ReasonDeadline                  // estimated wait exceeds the deadline at arrival
	ReasonExpired                   // the deadline passed while queued
	numReasons
)

var reasonNames = [numReasons]string{"queue_full", "queue_tokens", "tenant_share", "evicted", "deadline", "expired"}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// sentinel is the narrow sentinel the reason matches.
func (r Reason) sentinel() error {
	if r == ReasonDeadline || r == ReasonExpired {
		return ErrDeadline
	}
	return ErrQueueFull
}

// ShedError is a refusal with a hint for the client. Match it with
// errors.Is(err, ErrShed) (any refusal) or the narrower sentinels; read
// RetryAfter with errors.As.
type ShedError struct {
	Reason Reason
	// RetryAfter is when a retry has a fair chance: the estimated time for
	// the queue ahead to drain, clamped to [1s, Config.MaxRetryAfter]. The
	// proxy sends it as Retry-After (whole seconds, rounded up).
	RetryAfter time.Duration
	// Wait is the estimated wait that made a deadline refusal (0 for other
	// reasons or when no drain rate has been measured yet).
	Wait time.Duration
}

func (e *ShedError) Error() string {
	s := "admission: request shed: " + e.Reason.String()
	if e.Wait > 0 {
		s += " (estimated wait " + e.Wait.Round(time.Millisecond).String() + ")"
	}
	return s + ", retry after " + e.RetryAfter.String()
}

// Unwrap makes the error match ErrShed and its reason's sentinel.
func (e *ShedError) Unwrap() []error { return []error{ErrShed, e.Reason.sentinel()} }

// RetryAfterSeconds is RetryAfter in whole seconds, rounded up, at least 1:
// the value of an HTTP Retry-After header.
func (e *ShedError) RetryAfterSeconds() int {
	s := int((e.RetryAfter + time.Second - 1) / time.Second)
	return max(s, 1)
}
