package sim

import (
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"
)

// rateLimitErrorType is the error type of a 429. vLLM names error types
// after openai-python's exception classes (BadRequestError, NotFoundError,
// InternalServerError), whose class for 429 is RateLimitError.
const rateLimitErrorType = "RateLimitError"

// retryAfter is the Retry-After header of a 429, "" for none.
func (f Faults) retryAfter() string {
	switch {
	case f.RetryAfterSeconds < 0:
		return ""
	case f.RetryAfterSeconds == 0:
		return "1"
	}
	return strconv.Itoa(f.RetryAfterSeconds)
}

// writeTooManyRequests refuses a request as an engine with a bounded queue
// does: 429, Retry-After, and vLLM's error document.
func writeTooManyRequests(ctx *fasthttp.RequestCtx, f *Faults, msg string) {
	if ra := f.retryAfter(); ra != "" {
		ctx.Response.Header.Set("retry-after", ra)
	}
	writeError(ctx, fasthttp.StatusTooManyRequests, rateLimitErrorType, msg)
}

// queueFullLocked reports whether a request reaching the engine now is
// refused by MaxWaitingQueueLength. r.mu must be held, so that the check and
// the admission that follows it are one step and the queue never grows past
// the limit.
func (r *Replica) queueFullLocked(f *Faults) bool {
	return f.MaxWaitingQueueLength > 0 && r.eng.waiting.len() >= f.MaxWaitingQueueLength
}

func queueFullMessage(limit int) string {
	return fmt.Sprintf("The engine's waiting queue is full (max_waiting_queue_length=%d). Please retry later.", limit)
}
