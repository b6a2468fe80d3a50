package balancer

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Request is what a Picker may look at about the request being routed. It is
// filled once by the proxy's parser; pickers must not retain it.
type Request struct {
	AffinityKey string // session key: a session header or the `user` field (may be empty)
	PrefixHash  uint64 // hash of the prompt's prefix (system prompt / first tokens); 0 if none
	ArmKey      string // what A/B assignment hashes: the request id, or `user` when set
	Arm         string // A/B arm: set by the client's header to force one, else by Pool.Pick
	// LongPrefillCap, when > 0, marks the request as a long prefill and
	// excludes replicas already running that many long prefills, so a long
	// prompt never queues behind another on one replica while short
	// requests keep a free lane elsewhere.
	LongPrefillCap int
	Now            time.Time // when the request is being placed; the clock pickers use
	// Model is the model the request names ("" none): when it is one of
	// the pool's LoRA adapters, not its base model or an alias, the
	// policies place it by where that adapter is (lora.go).
	Model string
	lora  loraMatch // the pool's reading of Model, once per request

	// PromptTokens and OutputTokens are the request's estimated size
	// (0 = unknown): the predictive policy predicts its TTFT from the
	// prompt, and Room judges whether a replica has room for both.
	PromptTokens, OutputTokens int
	// SLOTTFT and SLOTPOT are the request's latency objectives (its SLO
	// headers); zero means the pool's defaults (ScoreConfig.SLOTTFT, SLOTPOT).
	SLOTTFT, SLOTPOT time.Duration
	// Prefix is the request's prompt as prefix-cache block keys
	// (prefixcache.AppendKeys over its tokens in the pool's block size),
	// computed once by the proxy; nil when unknown. With the pool's
	// PrefixCache, the policies count only the tokens a replica does not
	// hold as its prefill (CachedTokens).
	Prefix []uint64
	prefix prefixMatch // the pool's lookup of Prefix, once per request

	// Room, when set, is the admission rule that let the request in: the
	// pool first picks only among replicas where it Fits, so a request
	// admitted because some replica had room goes to one that has room,
	// not to whichever replica the policy's own score prefers (which may
	// be saturated). When none fits, the policy picks as without it.
	Room Room

	roomOn bool // Pool.Pick is in its first, room-only pass
	// roomButPrefill relaxes the room pass to "room but for the prefill
	// queued there" (Predictive.Pick's second look).
	roomButPrefill bool
	// roomForCache relaxes the room pass for a replica holding most of
	// the prompt in its prefix cache (cachedRoom): Predictive.Pick's
	// last pass.
	roomForCache bool
	poolScore    *ScoreConfig // the pool's staleness rule, for Room's loads
	// soonest is, during a predictive pick, the earliest predicted finish
	// (TTFT + output × TPOT, seconds from now) among the replicas usable
	// for the request, room or not; 0 when its output is unknown.
	soonest float64
}

// Room is admission's per-replica rule, as the pool applies it when
// picking (see Request.Room): whether a request of the given size may be
// placed on a replica with load l without queueing in its engine. It must
// not block or allocate.
type Room interface {
	// FitsReplica: tpot is the request's TPOT objective, 0 for none.
	FitsReplica(l ReplicaLoad, promptTokens, outputTokens int, tpot time.Duration) bool
}

// eligible reports whether a picker may choose c for r.
func eligible(c *Replica, r *Request) bool {
	if !usable(c, r) {
		return false
	}
	if r.roomOn && !(r.roomForCache && r.cachedRoom(c)) {
		l := c.loadAt(r.Now, r.poolScore, false)
		if r.roomButPrefill {
			l.PrefillWait = 0
		}
		return r.Room.FitsReplica(l, r.uncached(c), r.OutputTokens, r.SLOTPOT)
	}
	return true
}

// usable reports whether c could take r at all, room aside: available,
// not resting, and under r's long-prefill cap.
func usable(c *Replica, r *Request) bool {
	return c.Available(r.Now) && !c.Resting(r.Now) && (r.LongPrefillCap <= 0 || c.longPrefills.Load() < int64(r.LongPrefillCap))
}

// Picker chooses a replica for a request among candidates. It returns nil
// when none is available. Pick must not block and must not allocate.
type Picker interface {
	Pick(r *Request, candidates []*Replica) *Replica
}

// preparer is implemented by pickers that precompute per replica set (the
// affinity policies' hash ring). Pools call it whenever their set changes.
type preparer interface {
	Prepare(replicas []*Replica)
}

// PickerOptions configure NewPickerWith. The zero value gives defaults.
type PickerOptions struct {
	Score ScoreConfig
	// Rand returns a uniform int in [0,n) for random, p2c and near_equal
	// (least_loaded, predictive); nil means math/rand/v2. Inject a seeded
	// source for reproducible tests.
	Rand func(n int) int
}

// Policies lists the policy names NewPicker knows.
func Policies() []string {
	return []string{"least_loaded", "least_request", "round_robin", "random", "kv_aware", "p2c", "least_tokens", "prefix_affinity", "session_affinity", "predictive"}
}

// DefaultPolicy is the policy of a pool that names none.
const DefaultPolicy = "predictive"

// NewPicker builds the named policy with default options.
func NewPicker(name string) (Picker, error) { return NewPickerWith(name, PickerOptions{}) }

// NewPickerWith builds the named policy.
func NewPickerWith(name string, o PickerOptions) (Picker, error) {
	cfg := o.Score.withDefaults()
	rnd := o.Rand
	if rnd == nil {
		rnd = rand.IntN
	}
	switch name {
	case "round_robin":
		return &RoundRobin{}, nil
	case "least_request":
		return &LeastRequest{}, nil
	case "predictive", "":
		return &Predictive{cfg: &cfg, near: newNearEqual(cfg.NearEqual, rnd)}, nil
	case "least_loaded":
		return &scanPicker{s: loadScorer{&cfg}, near: newNearEqual(cfg.NearEqual, rnd), cfg: &cfg}, nil
	case "kv_aware":
		return &scanPicker{s: kvScorer{&cfg}, cfg: &cfg}, nil
	case "least_tokens":
		return &scanPicker{s: tokenScorer{&cfg}, cfg: &cfg}, nil
	case "random":
		return &Random{rand: rnd}, nil
	case "p2c":
		return &P2C{cfg: &cfg, rand: rnd, fallback: scanPicker{s: loadScorer{&cfg}}}, nil
	case "prefix_affinity":
		return newPrefixAffinity(&cfg), nil
	case "session_affinity":
		return newAffinity(&cfg, sessionKey), nil
	}
	return nil, fmt.Errorf("balancer: unknown policy %q (known: %v)", name, Policies())
}

var (
	_ Picker = (*RoundRobin)(nil)
	_ Picker = (*LeastRequest)(nil)
)

// RoundRobin cycles through the available candidates. The zero value is
// ready to use.
type RoundRobin struct {
	// next is where the following scan starts. Each pick reserves a start
	// with Add, then moves next just past the replica it chose, so skipped
	// (unavailable) replicas don't hand their turn to their successor.
	next atomic.Uint64
}

// Pick returns the next available candidate after the previous pick.
func (p *RoundRobin) Pick(r *Request, candidates []*Replica) *Replica {
	n := uint64(len(candidates))
	if n == 0 {
		return nil
	}
	start := p.next.Add(1) - 1
	for i := uint64(0); i < n; i++ {
		c := candidates[(start+i)%n]
		if eligible(c, r) {
			advancePast(&p.next, start, i)
			return c
		}
	}
	return nil
}

// advancePast moves a rotation counter to just after the candidate chosen at
// offset i from start. Without it, a scan that skips unavailable replicas
// ends on the same replica as the scan that started one position later, so
// the first available replica after a gap gets a double share (with [A, down,
// B] B would take 2/3). The CAS only succeeds if no concurrent pick has moved
// the counter since this one reserved start; if one has, its position wins,
// which keeps concurrent picks spread out.
func advancePast(next *atomic.Uint64, start, i uint64) {
	if i > 0 {
		next.CompareAndSwap(start+1, start+i+1)
	}
}

// LeastRequest picks the available candidate with the fewest requests in
// flight from this router, relative to its weight. Ties rotate so equal
// replicas share traffic instead of the first one taking every tie. The zero
// value is ready to use.
type LeastRequest struct {
	// next is where the following scan starts; like RoundRobin it moves just
	// past the replica chosen, so among tied replicas the scan order (and so
	// the winner of the tie) rotates evenly even when some are unavailable.
	next atomic.Uint64
}

// Pick returns the least-loaded available candidate.
func (p *LeastRequest) Pick(r *Request, candidates []*Replica) *Replica {
	n := uint64(len(candidates))
	if n == 0 {
		return nil
	}
	start := p.next.Add(1) - 1
	var best *Replica
	var bestLoad float64
	var bestAt uint64
	for i := uint64(0); i < n; i++ {
		c := candidates[(start+i)%n]
		if !eligible(c, r) {
			continue
		}
		// +1: the load the replica would carry with this request, so that
		// with weights an idle weight-2 replica and an idle weight-1 one don't
		// tie at 0 (Envoy's weighted least-request does the same).
		load := float64(c.InFlight()+1) / c.weight
		if best == nil || load < bestLoad {
			best, bestLoad, bestAt = c, load, i
		}
	}
	if best != nil {
		advancePast(&p.next, start, bestAt)
	}
	return best
}
