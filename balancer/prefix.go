package balancer

import (
	"math"
	"sync/atomic"

	"github.com/gpurouter/gpurouter/prefixcache"
)

// PrefixCache is what a pool knows of its engines' prefix caches: which
// replica holds which of a prompt's blocks (prefixcache.Index, keyed by
// the router's chained hash over the prompt's tokens in the engines'
// block size). The predictive policy predicts a request's prefill on each
// replica from the tokens that replica does not hold, prefix_affinity
// sends it where its longest prefix is, and a lease queues only the
// uncached part as prefill work. Set it with Pool.SetPrefixCache; a pool
// without one routes as if nothing were cached.
type PrefixCache struct {
	Index *prefixcache.Index
	// BlockSize is the engines' block size in tokens: the configured one,
	// or the one assumed until an engine reports its own (LearnBlockSize).
	// Read it with Block.
	BlockSize int
	// learned is the block size an engine reported
	// (vllm:cache_config_info), which overrides BlockSize; 0 while none
	// did.
	learned atomic.Int32
	// Approximate says the index is fed by the router's own placements:
	// each request's blocks are recorded on the replica it goes to
	// (AcquireRequest) and age out as its KV capacity says they must.
	// False: the engines' KV-cache events feed it, and placements don't.
	Approximate bool
	// Tokenizer and Chat turn a request's prompt into the engines' tokens
	// when the index is keyed by them (not Approximate): the keys are
	// prefixcache.AppendKeys(RootSeed, tokens, BlockSize), as the
	// events' Tracker keys the engines' blocks. Nil when Approximate: the
	// keys are prefixcache.TextKeys over the prompt's text.
	Tokenizer prefixcache.Tokenizer
	Chat      prefixcache.ChatTemplate
}

// Block is the block size a prompt's keys are cut in: the one an engine
// reported (LearnBlockSize), else BlockSize.
func (pc *PrefixCache) Block() int {
	if n := pc.learned.Load(); n > 0 {
		return int(n)
	}
	return pc.BlockSize
}

// LearnBlockSize takes n, an engine's reported block size, as the pool's
// (Block) when no engine reported one before; it reports whether n is the
// pool's block size now. An engine reporting another size than the first
// one's caches blocks the pool's keys never match: false says so.
func (pc *PrefixCache) LearnBlockSize(n int) bool {
	if n <= 0 || n > math.MaxInt32 {
		return false
	}
	return pc.learned.CompareAndSwap(0, int32(n)) || pc.learned.Load() == int32(n)
}

// SetPrefixCache gives the pool its prefix cache (nil: none). Replicas
// are tied to their index slots with Replica.SetPrefixSlot.
func (p *Pool) SetPrefixCache(pc *PrefixCache) {
	if pc != nil && (pc.Index == nil || pc.BlockSize <= 0) {
		pc = nil
	}
	p.prefix.Store(pc)
}

// PrefixCache is the pool's prefix cache, nil when it has none.
func (p *Pool) PrefixCache() *PrefixCache { return p.prefix.Load() }

// SetPrefixSlot ties the replica to its slot in its pool's prefix index
// (prefixcache.Index.Add); a negative slot unties it.
func (r *Replica) SetPrefixSlot(slot int) {
	if slot < 0 || slot >= prefixcache.MaxReplicas {
		r.prefixSlot.Store(0)
		return
	}
	r.prefixSlot.Store(int32(slot) + 1)
}

// PrefixSlot is the replica's slot in its pool's prefix index; false when
// it has none.
func (r *Replica) PrefixSlot() (int, bool) {
	s := r.prefixSlot.Load()
	return int(s) - 1, s > 0
}

// prefixMatch is a request's lookup in its pool's prefix index, done once
// per request (retries reuse it): per index slot, how many of the
// prompt's leading blocks that replica holds.
type prefixMatch struct {
	held [prefixcache.MaxReplicas]uint16
	// most is the longest of them: some replica holds a block of it when
	// it is above 0.
	most    uint16
	looked  bool
	indexed bool // the pool has an index: held says what it holds
	// block is the tokens of one key when the keys are the engines'
	// blocks (an index fed by events): a hit is then exactly that many
	// tokens a block. 0 for text keys, whose hits are a share of the prompt.
	block int32
}

// found reports whether some replica holds a block of the prompt.
func (m *prefixMatch) found() bool { return m.most > 0 }

// lookupPrefix fills r's match from the pool's index, once.
func (p *Pool) lookupPrefix(r *Request) {
	if r.prefix.looked || len(r.Prefix) == 0 {
		return
	}
	r.prefix.looked = true
	pc := p.prefix.Load()
	if pc == nil {
		return
	}
	var held [prefixcache.MaxReplicas]int
	r.prefix.indexed = true
	if !pc.Approximate {
		r.prefix.block = int32(pc.Block())
	}
	r.prefix.most = uint16(min(pc.Index.Lookup(r.Prefix, held[:]), 1<<16-1))
	for i, n := range held {
		r.prefix.held[i] = uint16(min(n, 1<<16-1))
	}
}

// CachedTokens is how many of r's prompt tokens replica c holds in its
// prefix cache, as the pool's index says (0 without one): its longest
// prefix match in blocks of the engines' block size when the keys are
// the engines' blocks (an index fed by events), else the matched share of
// the prompt's text blocks (an approximate index) of its tokens — and
// never the whole prompt: an engine computes at least the last prompt
// token to produce the first output token.
func (r *Request) CachedTokens(c *Replica) int {
	if c == nil || !r.prefix.looked || len(r.Prefix) == 0 {
		return 0
	}
	s, ok := c.PrefixSlot()
	if !ok {
		return 0
	}
	return r.heldTokens(r.prefix.held[s])
}

// MostCachedTokens is the most of r's prompt tokens any replica of its
// pool holds in its prefix cache, as the index says (CachedTokens of the
// best-placed one, whether or not it was a candidate): 0 without an index
// or before r's lookup.
func (r *Request) MostCachedTokens() int {
	if !r.prefix.looked || len(r.Prefix) == 0 {
		return 0
	}
	return r.heldTokens(r.prefix.most)
}

// heldTokens is the prompt tokens of n leading keys held: whole engine
// blocks where the keys are blocks, else that share of the prompt; never
// the whole prompt, as an engine computes at least the last prompt token
// to produce the first output token.
func (r *Request) heldTokens(n uint16) int {
	t := int(int64(r.PromptTokens) * int64(n) / int64(len(r.Prefix)))
	if r.prefix.block > 0 {
		t = int(n) * int(r.prefix.block)
	}
	return max(min(t, r.PromptTokens-1), 0)
}

// MostCached is the most of r's prompt tokens any of among holds in its
// prefix cache, as p's index says (0 without one): what a split (proxy:
// disagg.go) saves by serving r where its prompt is already cached. r is
// a request for p; the lookup is done once, as for its picks.
func (p *Pool) MostCached(r *Request, among []*Replica) int {
	p.lookupPrefix(r)
	most := 0
	for _, c := range among {
		most = max(most, r.CachedTokens(c))
	}
	return most
}

// meanLoad is the requests in flight per replica over candidates, this
// one included: what cachedWithin bounds a replica's load by.
func meanLoad(candidates []*Replica) float64 {
	var total int64
	if g := candidates[0].group.Load(); g != nil {
		total = g.Load()
	} else {
		for _, c := range candidates {
			total += c.inFlight.Load()
		}
	}
	return float64(total+1) / float64(len(candidates))
}

// cachedWithin is CachedTokens(c) while c's load is within the bound
// that keeps cache affinity from making a hot spot, else 0: in flight
// (this request included, per unit of capacity) at most
// ⌈(1 + ε·(1 + 2f))·mean·s⌉, f the share of the prompt c holds and s
// c's learned speed (relSpeed: 1, or less for a replica measured slower
// than the pool). A replica holding most of a long prompt saves its
// whole prefill there — seconds at tens of thousands of tokens — so it
// may run up to (1 + 3ε)× the mean (1.75× by default) before the
// request goes elsewhere; one holding a sliver of it (1 + ε)×, as
// bounded-load hashing allows. No replica takes much more than its
// share of a hot prefix, and the others soon hold the prefixes they are
// sent, so a hot one spreads.
//
// The speed is why a half-speed replica's bound is about the mean, not
// 1.75× it: its capacity in configuration (weight) says nothing of its
// speed, and counted as a whole replica it could run 1.75× the mean in
// flight for the prompts it holds — 3.5× its share of the work, the hot
// spot the bound is there to prevent.
func (r *Request) cachedWithin(c *Replica, cfg *ScoreConfig, mean float64, pr *prior) int {
	cached := r.CachedTokens(c)
	if cached == 0 {
		return 0
	}
	f := float64(cached) / float64(max(r.PromptTokens, 1))
	if float64(c.inFlight.Load()+1)/c.capacity() > math.Ceil((1+cfg.Epsilon*(1+2*f))*mean*c.relSpeed(pr)) {
		return 0
	}
	return cached
}

// relSpeed is c's prefill speed relative to the pool's (pr: the mean of
// the candidates' learned prefill slopes), at most 1: about 0.5 for a
// replica that prefills at half the others' rate, 1 for one as fast or
// faster, or not measured yet (nothing to say it is slow).
func (c *Replica) relSpeed(pr *prior) float64 {
	_, b, ok := c.pred.ttft.coeffs()
	if !ok || b <= 0 || !pr.ttftLearned || pr.ttftB >= b {
		return 1
	}
	return pr.ttftB / b
}

// cachedRoom reports whether c holds most of r's prompt (at least half
// of its tokens) in its prefix cache: enough that its prefill there is a
// fraction of what it is anywhere else.
func (r *Request) cachedRoom(c *Replica) bool {
	return r.PromptTokens > 0 && 2*r.CachedTokens(c) >= r.PromptTokens
}

// uncached is r's prompt tokens c would have to prefill.
func (r *Request) uncached(c *Replica) int {
	return max(r.PromptTokens-r.CachedTokens(c), 0)
}

// recordPlacement counts a placed request's predicted hits, and the hits
// another replica (most: the most any held) would have had, and, in an
// approximate index (PrefixCache.Approximate), stores its blocks on the
// replica: the engine will hold them once it has prefilled the prompt.
func (r *Replica) recordPlacement(keys []uint64, uncached, cached, most int64) {
	if len(keys) == 0 {
		return
	}
	r.prefixPrompt.Add(max(uncached, 0) + max(cached, 0))
	r.prefixCached.Add(max(cached, 0))
	r.prefixForgone.Add(max(most-cached, 0))
	p := r.pool.Load()
	if p == nil {
		return
	}
	pc := p.prefix.Load()
	if pc == nil || !pc.Approximate {
		return
	}
	if s, ok := r.PrefixSlot(); ok {
		pc.Index.Store(s, keys)
	}
}

// PrefixStats is a replica's view in its pool's prefix index.
type PrefixStats struct {
	// Blocks is how many keys the index holds for the replica.
	Blocks int `json:"blocks"`
	// BlockSize is the tokens of one key when the keys are the engines'
	// blocks (an index fed by events; PrefixCache.Block); 0 for text keys.
	BlockSize int `json:"block_size,omitempty"`
	// PromptTokens sums the prompts placed on the replica with keys;
	// CachedTokens how many of those tokens the index said it held.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"predicted_cached_tokens"`
	// ForgoneTokens is how many more of those prompts' tokens another
	// replica held, as the index said: cache affinity the placements gave
	// up for load or an objective (what the bounded load costs in hits).
	ForgoneTokens int64 `json:"forgone_cached_tokens"`
	// HitRate is CachedTokens / PromptTokens: the index's predicted
	// prefix-cache hit rate (0 before any request).
	HitRate float64 `json:"predicted_hit_rate"`
}

// PrefixStats is the replica's prefix index view; nil when its pool has
// no index or the replica no slot in it.
func (r *Replica) PrefixStats() *PrefixStats {
	p := r.pool.Load()
	if p == nil {
		return nil
	}
	pc := p.prefix.Load()
	s, ok := r.PrefixSlot()
	if pc == nil || !ok {
		return nil
	}
	st := &PrefixStats{Blocks: pc.Index.Len(s), PromptTokens: r.prefixPrompt.Load(), CachedTokens: r.prefixCached.Load(),
		ForgoneTokens: r.prefixForgone.Load()}
	if !pc.Approximate {
		st.BlockSize = pc.Block()
	}
	if st.PromptTokens > 0 {
		st.HitRate = float64(st.CachedTokens) / float64(st.PromptTokens)
	}
	return st
}
