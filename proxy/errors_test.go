package proxy

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/gpurouter/gpurouter/proxy/auth"
)

func TestAdmissionShedIsOutcomeShed(t *testing.T) {
	err := &admission.ShedError{Reason: admission.ReasonQueueFull, RetryAfter: 3 * time.Second}
	if o, _ := outcomeOf(err, 429); o != outcomeShed {
		t.Fatalf("outcome %s, want shed", o)
	}
	if statusOf(err) != 429 || retryAfterSeconds(err) != 3 {
		t.Fatalf("status %d retry-after %d", statusOf(err), retryAfterSeconds(err))
	}
}

// TestOutcomeOf pins what every ending means for the record and for the
// replica's breaker: one table (errorTable) answers both.
func TestOutcomeOf(t *testing.T) {
	const (
		success = iota // the breaker counts a success
		failure        // the breaker counts a failure
		neutral        // the breaker counts neither
	)
	tests := []struct {
		name    string
		err     error
		status  int
		outcome outcome
		breaker int
	}{
		{"ok", nil, 200, outcomeOK, success},
		{"engine 429", nil, 429, outcomeShed, neutral},
		{"engine 400", nil, 400, outcomeClientError, success},
		{"engine 500", nil, 500, outcomeUpstreamError, failure},
		{"client gone", fmt.Errorf("%w: x", ErrClientGone), 499, outcomeCanceled, neutral},
		{"shutdown", ErrShuttingDown, 503, outcomeShutdown, neutral},
		{"timeout", fmt.Errorf("%w: idle", ErrTimeout), 504, outcomeTimeout, failure},
		{"broken stream", fmt.Errorf("%w: eof", errBrokenStream), 200, outcomeBrokenStream, failure},
		{"upstream", fmt.Errorf("%w: refused", ErrUpstream), 502, outcomeUpstreamError, failure},
		{"no replica", ErrNoReplica, 503, outcomeNoReplica, success},
		{"router shed", ErrShed, 429, outcomeShed, success},
		{"deadline", &admission.ShedError{Reason: admission.ReasonDeadline}, 429, outcomeShed, success},
		{"rate limited", auth.ErrRateLimited, 429, outcomeRateLimited, success},
		{"unauthorized", auth.ErrUnauthorized, 401, outcomeClientError, success},
		{"forbidden", auth.ErrForbidden, 403, outcomeClientError, success},
		{"bad param", openai.BadParam("model", "x"), 400, outcomeClientError, success},
		{"unknown model", ErrUnknownModel, 404, outcomeClientError, success},
		{"not found", ErrNotFound, 404, outcomeClientError, success},
		{"method", ErrMethodNotAllowed, 405, outcomeClientError, success},
		{"too large", ErrBodyTooLarge, 413, outcomeClientError, success},
		{"unknown error", errors.New("boom"), 500, outcomeUpstreamError, failure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, berr := outcomeOf(tt.err, tt.status)
			if o != tt.outcome {
				t.Errorf("outcome %s, want %s", o, tt.outcome)
			}
			got := failure
			switch {
			case berr == nil:
				got = success
			case errors.Is(berr, balancer.ErrNotReplicaFault):
				got = neutral
			}
			if got != tt.breaker {
				t.Errorf("breaker sees %d (%v), want %d", got, berr, tt.breaker)
			}
		})
	}
}
