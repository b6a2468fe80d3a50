package auth

import (
	"math"
	"sync"
	"time"
)

// bucket is a token bucket sized for one minute: it holds up to perMinute
// units, starts full and refills continuously at perMinute/60 per second.
// The zero value is unlimited.
//
// A request larger than the whole bucket would never fit, so it is let
// through once the bucket is full and leaves the bucket in debt (a
// negative level), which delays the requests after it instead.
type bucket struct {
	perMinute float64   // capacity and refill per minute; 0 = unlimited
	level     float64   // units available now; negative after an oversized request
	at        time.Time // when level was last brought up to date
}

func newBucket(perMinute float64, now time.Time) bucket {
	return bucket{perMinute: perMinute, level: perMinute, at: now}
}

func (b *bucket) unlimited() bool { return b.perMinute <= 0 }

// refill brings level up to date; a clock that steps back refills nothing.
func (b *bucket) refill(now time.Time) {
	if b.unlimited() || !now.After(b.at) {
		return
	}
	b.level = min(b.perMinute, b.level+now.Sub(b.at).Minutes()*b.perMinute)
	b.at = now
}

// wait is how long until n units can be taken (0: now), rounded up to the
// millisecond so that waiting that long is always enough.
func (b *bucket) wait(n float64) time.Duration {
	if b.unlimited() {
		return 0
	}
	need := min(n, b.perMinute)
	if b.level+levelSlack >= need {
		return 0
	}
	ms := math.Ceil((need - b.level) / b.perMinute * 60e3)
	return time.Duration(ms) * time.Millisecond
}

// levelSlack absorbs float rounding in refill, so that a client that waits
// exactly the wait it was told is let in.
const levelSlack = 1e-6

func (b *bucket) take(n float64) {
	if !b.unlimited() {
		b.level -= n
	}
}

// limiter is one API key's request and token buckets. Tokens are the
// router's estimate (prompt + expected output), charged when the request
// is let in.
type limiter struct {
	mu       sync.Mutex
	requests bucket
	tokens   bucket
}

func newLimiter(k KeyConfig, now time.Time) *limiter {
	return &limiter{requests: newBucket(k.RequestsPerMinute, now), tokens: newBucket(k.TokensPerMinute, now)}
}

// quota names the bucket that refused a request.
type quota uint8

const (
	quotaNone quota = iota
	quotaRequests
	quotaTokens
)

// allow takes one request and tokens units if both buckets have them.
// Otherwise it takes nothing and tells which limit refused and how long
// until the request would pass both (the longer wait).
func (l *limiter) allow(now time.Time, tokens int64) (quota, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests.refill(now)
	l.tokens.refill(now)
	n := float64(max(tokens, 0))
	wr, wt := l.requests.wait(1), l.tokens.wait(n)
	switch {
	case wr == 0 && wt == 0:
		l.requests.take(1)
		l.tokens.take(n)
		return quotaNone, 0
	case wr >= wt:
		return quotaRequests, wr
	default:
		return quotaTokens, wt
	}
}
