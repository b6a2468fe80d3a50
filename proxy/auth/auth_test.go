package auth

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// Raw test keys. They must never show up in logs or metrics.
const (
	keyAlpha = "sk-alpha-1f0c9e4b7a2d4c8e9b3a6f5d2c1e0b9a"
	keyBeta  = "sk-beta-77d2a1c4e5f60718293a4b5c6d7e8f90"
	keyWrong = "sk-wrong-0000000000000000000000000000dead"
)

// testClock is a settable clock for the rate limits.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Unix(1_700_000_000, 0)} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func bearer(key string) []byte { return []byte("Bearer " + key) }

func mustKeyStore(t *testing.T, clock *testClock, keys ...KeyConfig) *KeyStore {
	t.Helper()
	ks, err := NewKeyStore(keys, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func TestAuthAuthorize(t *testing.T) {
	ks := mustKeyStore(t, newTestClock(),
		KeyConfig{ID: "alpha", Hash: HashKey(keyAlpha), Tier: 2},
		KeyConfig{ID: "beta", Hash: "sha256:" + strings.ToUpper(HashKey(keyBeta)[7:]), Models: []string{"m2"}},
	)
	tests := []struct {
		name   string
		header string
		model  string
		want   error
		id     string
		tier   int
	}{
		{"no header", "", "m", ErrUnauthorized, "", 0},
		{"basic scheme", "Basic " + keyAlpha, "m", ErrUnauthorized, "", 0},
		{"bearer without key", "Bearer ", "m", ErrUnauthorized, "", 0},
		{"bearer blank key", "Bearer    ", "m", ErrUnauthorized, "", 0},
		{"bare key", keyAlpha, "m", ErrUnauthorized, "", 0},
		{"wrong key", "Bearer " + keyWrong, "m", ErrUnauthorized, "", 0},
		{"key prefix", "Bearer " + keyAlpha[:len(keyAlpha)-1], "m", ErrUnauthorized, "", 0},
		{"key with suffix", "Bearer " + keyAlpha + "x", "m", ErrUnauthorized, "", 0},
		{"valid", "Bearer " + keyAlpha, "m", nil, "alpha", 2},
		{"scheme case and spaces", "bEARER  " + keyAlpha + " ", "m", nil, "alpha", 2},
		{"upper-case hash in config", "Bearer " + keyBeta, "m2", nil, "beta", 0},
		{"model not allowed", "Bearer " + keyBeta, "m", ErrForbidden, "beta", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ks.Authorize([]byte(tt.header), tt.model, 10)
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
			if p.ID != tt.id || p.Tier != tt.tier {
				t.Fatalf("principal %q tier %d, want %q tier %d", p.ID, p.Tier, tt.id, tt.tier)
			}
			if err != nil && (strings.Contains(err.Error(), keyAlpha[3:20]) || strings.Contains(err.Error(), keyWrong[3:20])) {
				t.Fatalf("error quotes the presented key: %v", err)
			}
		})
	}
}

func TestAuthRequestRateLimit(t *testing.T) {
	clock := newTestClock()
	ks := mustKeyStore(t, clock, KeyConfig{ID: "a", Hash: HashKey(keyAlpha), RequestsPerMinute: 3})
	for i := range 3 {
		if _, err := ks.Authorize(bearer(keyAlpha), "m", 1); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	_, err := ks.Authorize(bearer(keyAlpha), "m", 1)
	var ra interface{ RetryAfter() time.Duration }
	if !errors.Is(err, ErrRateLimited) || !errors.As(err, &ra) {
		t.Fatalf("4th request: %v, want a rate-limit error with RetryAfter", err)
	}
	if got := ra.RetryAfter(); got != 20*time.Second {
		t.Fatalf("RetryAfter %v, want 20s (one request refills in 60s/3)", got)
	}
	if !strings.Contains(err.Error(), `"a" allows 3 requests per minute`) {
		t.Fatalf("message: %v", err)
	}
	clock.Advance(ra.RetryAfter() - time.Millisecond)
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 1); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("just before the refill: %v, want refused", err)
	}
	clock.Advance(time.Millisecond)
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 1); err != nil {
		t.Fatalf("after Retry-After: %v", err)
	}
	// A long quiet spell refills to one minute's allowance, no more.
	clock.Advance(time.Hour)
	for i := range 3 {
		if _, err := ks.Authorize(bearer(keyAlpha), "m", 1); err != nil {
			t.Fatalf("burst request %d: %v", i, err)
		}
	}
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 1); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("burst beyond the bucket: %v, want refused", err)
	}
}

func TestAuthTokenRateLimit(t *testing.T) {
	clock := newTestClock()
	ks := mustKeyStore(t, clock, KeyConfig{ID: "a", Hash: HashKey(keyAlpha), RequestsPerMinute: 100, TokensPerMinute: 1000})
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 600); err != nil {
		t.Fatal(err)
	}
	_, err := ks.Authorize(bearer(keyAlpha), "m", 600)
	var rl *rateLimitError
	if !errors.As(err, &rl) || rl.quota != quotaTokens {
		t.Fatalf("second 600-token request: %v, want refused by the token limit", err)
	}
	if rl.RetryAfter() != 12*time.Second { // 200 missing tokens at 1000/min
		t.Fatalf("RetryAfter %v, want 12s", rl.RetryAfter())
	}
	if !strings.Contains(err.Error(), "1000 tokens per minute (this request is estimated at 600)") {
		t.Fatalf("message: %v", err)
	}
	// A refusal charges nothing: 98 more small requests fit the request limit.
	for i := range 99 {
		if _, err := ks.Authorize(bearer(keyAlpha), "m", 0); err != nil {
			t.Fatalf("small request %d: %v", i, err)
		}
	}
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 0); !errors.As(err, &rl) || rl.quota != quotaRequests {
		t.Fatalf("101st request: %v, want refused by the request limit", err)
	}

	// A request larger than the whole bucket passes once it is full, and
	// its debt holds back what follows.
	clock.Advance(time.Hour)
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 3000); err != nil {
		t.Fatalf("oversized request on a full bucket: %v", err)
	}
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 1); !errors.As(err, &rl) || rl.RetryAfter() != 120*time.Second+60*time.Millisecond {
		t.Fatalf("after the oversized request: %v, want a wait of 2m0.06s (debt 2000 + 1 token at 1000/min)", err)
	}
}

func TestAuthReplaceKeepsLimits(t *testing.T) {
	clock := newTestClock()
	alpha := KeyConfig{ID: "a", Hash: HashKey(keyAlpha), RequestsPerMinute: 1}
	ks := mustKeyStore(t, clock, alpha)
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 1); err != nil {
		t.Fatal(err)
	}
	// Same id and limits: the empty bucket carries over; beta is new.
	if err := ks.Replace([]KeyConfig{alpha, {ID: "b", Hash: HashKey(keyBeta)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 1); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("reload reset the bucket: %v", err)
	}
	if _, err := ks.Authorize(bearer(keyBeta), "m", 1); err != nil {
		t.Fatalf("new key: %v", err)
	}
	// New limits: a fresh bucket. A removed key is refused.
	alpha.RequestsPerMinute = 2
	if err := ks.Replace([]KeyConfig{alpha}); err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 1); err != nil {
		t.Fatalf("changed limits: %v", err)
	}
	if _, err := ks.Authorize(bearer(keyBeta), "m", 1); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("removed key: %v", err)
	}
	// A bad set leaves the old one.
	if err := ks.Replace([]KeyConfig{{ID: "x", Hash: keyBeta}}); err == nil {
		t.Fatal("invalid keys accepted")
	}
	if ks.Len() != 1 {
		t.Fatalf("%d keys after a failed replace, want 1", ks.Len())
	}
}

func TestAuthEmptyStoreRefusesAll(t *testing.T) {
	ks := mustKeyStore(t, newTestClock())
	if _, err := ks.Authorize(bearer(keyAlpha), "m", 1); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("%v, want ErrUnauthorized", err)
	}
}

func TestAuthValidateKeys(t *testing.T) {
	good := KeyConfig{ID: "team-a", Hash: HashKey(keyAlpha)}
	tests := []struct {
		name string
		keys []KeyConfig
		want []string
	}{
		{"ok", []KeyConfig{good, {ID: "b", Hash: HashKey(keyBeta), Models: []string{"m"}, Tier: 3, RequestsPerMinute: 1, TokensPerMinute: 2}}, nil},
		{"missing id and hash", []KeyConfig{{}}, []string{"keys[0].id: required", "keys[0].hash: must be \"sha256:\""}},
		{"raw key as hash", []KeyConfig{{ID: "a", Hash: keyAlpha}}, []string{"keys[0].hash: must be"}},
		{"short hash", []KeyConfig{{ID: "a", Hash: HashKey(keyAlpha)[:70]}}, []string{"keys[0].hash"}},
		{"bad id", []KeyConfig{{ID: "a b", Hash: HashKey(keyAlpha)}}, []string{"keys[0].id: may only contain"}},
		{"long id", []KeyConfig{{ID: strings.Repeat("x", 65), Hash: HashKey(keyAlpha)}}, []string{"at most 64"}},
		{"duplicate id", []KeyConfig{good, {ID: "team-a", Hash: HashKey(keyBeta)}}, []string{"keys[1].id: already used by keys[0]"}},
		{"duplicate hash", []KeyConfig{good, {ID: "b", Hash: strings.ToUpper(good.Hash[7:])}}, []string{"keys[1].hash"}},
		{"duplicate hash other case", []KeyConfig{good, {ID: "b", Hash: "sha256:" + strings.ToUpper(good.Hash[7:])}}, []string{"keys[1].hash: already used by keys[0]"}},
		{"empty model", []KeyConfig{{ID: "a", Hash: HashKey(keyAlpha), Models: []string{"m", " "}}}, []string{"keys[0].models[1]"}},
		{"negative tier", []KeyConfig{{ID: "a", Hash: HashKey(keyAlpha), Tier: -1}}, []string{"keys[0].tier: must be >= 0"}},
		{"negative rate", []KeyConfig{{ID: "a", Hash: HashKey(keyAlpha), RequestsPerMinute: -1}}, []string{"keys[0].requests_per_minute"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateKeys("keys", tt.keys)
			if tt.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if strings.Contains(err.Error(), keyAlpha) || strings.Contains(err.Error(), keyBeta) {
				t.Errorf("error quotes a key: %v", err)
			}
		})
	}
}

// BenchmarkAuthAuthorize is the per-request cost of a valid key with both
// limits on (hash, lookup, constant-time compare, two buckets).
func BenchmarkAuthAuthorize(b *testing.B) {
	keys := make([]KeyConfig, 0, 1000)
	for i := range 1000 {
		keys = append(keys, KeyConfig{ID: fmt.Sprint("k", i), Hash: HashKey(fmt.Sprint("secret-", i)), RequestsPerMinute: 1e12, TokensPerMinute: 1e15, Models: []string{"m"}})
	}
	ks, err := NewKeyStore(keys, nil)
	if err != nil {
		b.Fatal(err)
	}
	h := bearer("secret-500")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ks.Authorize(h, "m", 300); err != nil {
			b.Fatal(err)
		}
	}
}
