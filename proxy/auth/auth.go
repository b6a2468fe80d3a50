// Package auth is the router's client authentication: API keys (stored
// hashed, found in constant time), each key's model allow-list, tier and
// rate limits in requests and tokens per minute, and the keys file's
// schema and checks. The proxy asks it once a request's key, then once its
// pool and cost are known; its errors say what the client gets.
package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Client authentication's errors: no or an unknown API key, a model the
// key may not use, a key over its rate limit (the error carries
// RetryAfter). proxy's error table says each to the client.
var (
	ErrUnauthorized = errors.New("unauthorized")
	ErrForbidden    = errors.New("forbidden")
	ErrRateLimited  = errors.New("rate limit exceeded")
)

// KeyConfig is one client API key as the router stores it: never the key
// itself, only its SHA-256, plus what the key may do. It is the schema of a
// keys file (see ParseKeys) and of the config file's auth.keys.
type KeyConfig struct {
	// ID names the key in logs, metrics and error messages; required,
	// unique, 1–64 of [A-Za-z0-9._:@/-]. It is not a secret.
	ID string `yaml:"id"`
	// Hash is "sha256:" and the 64 hex digits of the key's SHA-256
	// (HashKey; `gpurouter serve --hash-key KEY`); required, unique.
	Hash string `yaml:"hash"`
	// Models the key may use, by served model name (a pool's model); nil
	// means every model (an empty, non-nil list is invalid).
	Models []string `yaml:"models,omitempty"`
	// Tier is the key's admission priority class (higher goes first); a
	// request may ask for a lower class (X-Gpurouter-Priority), never a
	// higher one. Default 0.
	Tier int `yaml:"tier"`
	// RequestsPerMinute and TokensPerMinute cap the key's rate; each is a
	// token bucket holding one minute's allowance, so a quiet key may burst
	// that much at once. Tokens are estimated when the request arrives
	// (prompt + max_tokens, else 256). 0 means unlimited.
	RequestsPerMinute float64 `yaml:"requests_per_minute"`
	TokensPerMinute   float64 `yaml:"tokens_per_minute"`
}

// hashPrefix starts every KeyConfig.Hash.
const hashPrefix = "sha256:"

// HashKey is the KeyConfig.Hash of an API key.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hashPrefix + hex.EncodeToString(sum[:])
}

// Principal is the client a request was authenticated as. The zero value
// means no key: authentication is off.
type Principal struct {
	ID   string // the key's id; never the key
	Tier int    // the key's priority class
	key  *clientKey
}

// Authenticated reports whether p came with a valid key: not the zero
// Principal of a router without authentication.
func (p Principal) Authenticated() bool { return p.key != nil }

// AllModels reports whether p may use every model: no allow-list.
func (p Principal) AllModels() bool { return p.key == nil || p.key.models == nil }

// Allows reports whether p may use model (a pool's served model name).
func (p Principal) Allows(model string) bool {
	if p.key == nil || p.key.models == nil {
		return true
	}
	_, ok := p.key.models[model]
	return ok
}

// KeyStore authenticates clients by API key and enforces each key's model
// allow-list and rate limits. It is safe for concurrent use; Replace swaps
// the keys while requests run. A nil *KeyStore is not used: a proxy.Server
// without one has authentication off.
type KeyStore struct {
	now     func() time.Time
	keys    atomic.Pointer[keySet]
	replace sync.Mutex // serialises Replace
}

// keySet is one immutable generation of keys, indexed by hash.
type keySet struct {
	byHash map[[sha256.Size]byte]*clientKey
	byID   map[string]*clientKey
}

// clientKey is one key ready for the hot path.
type clientKey struct {
	cfg    KeyConfig
	hash   [sha256.Size]byte
	models map[string]struct{} // nil = every model
	lim    *limiter
}

// NewKeyStore checks keys (ValidateKeys) and builds a store over them; now
// is the clock of the rate limits (nil means time.Now). A store with no
// keys refuses every request: auth is on, nobody holds a key.
func NewKeyStore(keys []KeyConfig, now func() time.Time) (*KeyStore, error) {
	if now == nil {
		now = time.Now
	}
	s := &KeyStore{now: now}
	if err := s.Replace(keys); err != nil {
		return nil, err
	}
	return s, nil
}

// Replace swaps the store's keys (a reload). A key whose id and limits are
// unchanged keeps its rate-limit state; requests in progress are not
// affected. On error the old keys stay.
func (s *KeyStore) Replace(keys []KeyConfig) error {
	if err := ValidateKeys("keys", keys); err != nil {
		return err
	}
	s.replace.Lock()
	defer s.replace.Unlock()
	old := s.keys.Load()
	now := s.now()
	set := &keySet{
		byHash: make(map[[sha256.Size]byte]*clientKey, len(keys)),
		byID:   make(map[string]*clientKey, len(keys)),
	}
	for _, kc := range keys {
		k := &clientKey{cfg: kc}
		hex.Decode(k.hash[:], []byte(kc.Hash[len(hashPrefix):])) //nolint:errcheck // ValidateKeys checked it
		if len(kc.Models) > 0 {
			k.models = make(map[string]struct{}, len(kc.Models))
			for _, m := range kc.Models {
				k.models[m] = struct{}{}
			}
		}
		if prev, ok := old.lookupID(kc.ID); ok && prev.cfg.RequestsPerMinute == kc.RequestsPerMinute && prev.cfg.TokensPerMinute == kc.TokensPerMinute {
			k.lim = prev.lim
		} else {
			k.lim = newLimiter(kc, now)
		}
		set.byHash[k.hash] = k
		set.byID[kc.ID] = k
	}
	s.keys.Store(set)
	return nil
}

func (ks *keySet) lookupID(id string) (*clientKey, bool) {
	if ks == nil {
		return nil, false
	}
	k, ok := ks.byID[id]
	return k, ok
}

// Len is the number of keys.
func (s *KeyStore) Len() int { return len(s.keys.Load().byID) }

// Authenticate finds the key presented in an Authorization header value
// ("Bearer KEY"). The error (ErrUnauthorized) never contains the header.
func (s *KeyStore) Authenticate(authorization []byte) (Principal, error) {
	tok, ok := BearerToken(authorization)
	if !ok {
		return Principal{}, errMissingKey
	}
	sum := sha256.Sum256(tok)
	k := s.keys.Load().byHash[sum]
	// The map finds the candidate by the digest, which is not a secret;
	// the final equality is still checked in constant time.
	if k == nil || subtle.ConstantTimeCompare(k.hash[:], sum[:]) != 1 {
		return Principal{}, errWrongKey
	}
	return Principal{ID: k.cfg.ID, Tier: k.cfg.Tier, key: k}, nil
}

// Authorize is Authenticate then Permit. When the key was recognised the
// Principal comes with the error too, so that refusals can be logged by
// key id.
func (s *KeyStore) Authorize(authorization []byte, model string, estTokens int64) (Principal, error) {
	p, err := s.Authenticate(authorization)
	if err != nil {
		return p, err
	}
	return p, s.Permit(p, model, estTokens)
}

// Permit checks that p may use model (else ErrForbidden) and charges its
// rate limits one request and estTokens tokens (else ErrRateLimited,
// carrying RetryAfter; nothing is charged then). The zero Principal is
// always permitted.
func (s *KeyStore) Permit(p Principal, model string, estTokens int64) error {
	if p.key == nil {
		return nil
	}
	if !p.Allows(model) {
		return fmt.Errorf("%w: API key %q may not use model %q", ErrForbidden, p.ID, model)
	}
	if q, wait := p.key.lim.allow(s.now(), estTokens); q != quotaNone {
		return &rateLimitError{key: &p.key.cfg, quota: q, tokens: estTokens, wait: wait}
	}
	return nil
}

// Refusals without a recognised key. Their text says what to send, never
// what was sent.
var (
	errMissingKey = fmt.Errorf("%w: missing API key (send it in the Authorization header)", ErrUnauthorized)
	errWrongKey   = fmt.Errorf("%w: incorrect API key provided", ErrUnauthorized)
)

// BearerToken extracts the credentials of "Bearer <token>" (scheme
// case-insensitive, RFC 6750 §2.1).
func BearerToken(h []byte) ([]byte, bool) {
	const scheme = "bearer "
	if len(h) <= len(scheme) || !bytes.EqualFold(h[:len(scheme)], []byte(scheme)) {
		return nil, false
	}
	tok := bytes.TrimSpace(h[len(scheme):])
	return tok, len(tok) > 0
}

// Result names an authentication decision, err being its error (nil:
// the key passed), for metrics: ok, unauthorized, forbidden,
// rate_limited_requests or rate_limited_tokens.
func Result(err error) string {
	var rl *rateLimitError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &rl) && rl.quota == quotaRequests:
		return "rate_limited_requests"
	case errors.As(err, &rl):
		return "rate_limited_tokens"
	case errors.Is(err, ErrForbidden):
		return "forbidden"
	}
	return "unauthorized"
}

// rateLimitError is a request refused by its key's rate limit. It maps to
// 429 with Retry-After: the wait until the bucket holds enough.
type rateLimitError struct {
	key    *KeyConfig
	quota  quota
	tokens int64
	wait   time.Duration
}

func (e *rateLimitError) Error() string {
	var what string
	if e.quota == quotaRequests {
		what = fmt.Sprintf("%g requests per minute", e.key.RequestsPerMinute)
	} else {
		what = fmt.Sprintf("%g tokens per minute (this request is estimated at %d)", e.key.TokensPerMinute, e.tokens)
	}
	return "rate limit exceeded: API key " + strconv.Quote(e.key.ID) + " allows " + what + "; retry in " + e.wait.String()
}

func (e *rateLimitError) Unwrap() error { return ErrRateLimited }

// RetryAfter is how long until the request would pass.
func (e *rateLimitError) RetryAfter() time.Duration { return e.wait }
