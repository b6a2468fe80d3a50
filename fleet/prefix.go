package fleet

import (
	"fmt"
	"strings"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/kvevents"
	"github.com/gpurouter/gpurouter/prefixcache"
	"go.uber.org/zap"
)

// PrefixMode is where a pool's prefix index learns what each engine has
// cached.
type PrefixMode string

// The prefix modes. The zero value is PrefixOff.
const (
	// PrefixOff: no index; requests route as if nothing were cached.
	PrefixOff PrefixMode = ""
	// PrefixApproximate: the router's own placements feed the index,
	// keyed by the prompt's text, aged by each engine's KV capacity.
	PrefixApproximate PrefixMode = "approximate"
	// PrefixEvents: the engines' KV-cache events feed it, keyed by the
	// prompt's tokens in the engines' block size.
	PrefixEvents PrefixMode = "events"
)

// Defaults of PrefixCache's zero fields.
const (
	// DefaultPrefixBlockSize is vLLM's block size on CUDA: the one
	// assumed until an engine reports its own (vllm:cache_config_info),
	// when the file names none.
	DefaultPrefixBlockSize = 16
	// DefaultPrefixTokenizer is the embedded vocabulary the simulator
	// renders with.
	DefaultPrefixTokenizer = "cl100k_base"
	// defaultPrefixCapacityTokens bounds a replica's index entries until
	// its engine reports its KV capacity: 1M tokens of blocks.
	defaultPrefixCapacityTokens = 1 << 20
)

// PrefixCache is a pool's prefix index configuration. Its zero value is
// off. It is comparable: an unchanged one keeps the live index across
// changes.
type PrefixCache struct {
	Mode PrefixMode
	// BlockSize is the engines' KV block size in tokens (vLLM's
	// --block-size; events of another size are ignored). 0 means the
	// engines': the block_size the first of them reports in
	// vllm:cache_config_info, DefaultPrefixBlockSize until one does.
	// Events mode only.
	BlockSize int
	// Tokenizer is what a request's prompt is tokenized with: an
	// embedded vocabulary (prefixcache.NewBPE: cl100k_base, o200k_base;
	// chat rendered as the simulator does, prefixcache.CL100KChat), or a
	// value ending in ".json", the path of a model's Hugging Face
	// tokenizer.json (prefixcache.LoadHF; chat rendered as its ChatML or
	// Llama 3 tokens say, prefixcache.HF.ChatTemplate). The file is read
	// when the index is built; a reload with the same path keeps the
	// index and the tokenizer read before. "" means
	// DefaultPrefixTokenizer. Events mode only.
	Tokenizer string
	// KVEvents is where each replica publishes its events; events mode
	// requires Endpoint.
	KVEvents KVEvents
}

// KVEvents says where a pool's engines publish their KV-cache events
// (vLLM's --kv-events-config). Endpoints are templates filled from each
// replica's URL by kvevents.ExpandEndpoint ("tcp://{host}:5557"). Both of
// vLLM's encodings (array, map) are read.
type KVEvents struct {
	Endpoint       string // the PUB socket; required in events mode
	ReplayEndpoint string // the replay ROUTER socket; "" = none (every gap resyncs)
	Topic          string // subscription prefix; "" = every topic
}

// blockTokens is how many prompt tokens one index key of pc stands for:
// the engines' block size with events, a text block's bytes at four
// bytes a token when approximate.
func blockTokens(pc *balancer.PrefixCache) int {
	if !pc.Approximate {
		return pc.Block()
	}
	return prefixcache.DefaultBlockBytes / 4
}

// isTokenizerFile is whether a PrefixCache.Tokenizer names a
// tokenizer.json file rather than an embedded vocabulary.
func isTokenizerFile(name string) bool { return strings.HasSuffix(name, ".json") }

// prefixTokenizer is the tokenizer and chat rendering PrefixCache.Tokenizer
// names.
func prefixTokenizer(name string) (prefixcache.Tokenizer, prefixcache.ChatTemplate, error) {
	if !isTokenizerFile(name) {
		tok, err := prefixcache.NewBPE(name)
		return tok, prefixcache.CL100KChat(), err
	}
	tok, err := prefixcache.LoadHF(name)
	if err != nil {
		return nil, prefixcache.ChatTemplate{}, err
	}
	chat, err := tok.ChatTemplate()
	return tok, chat, err
}

// poolPrefix is one pool's prefix index and what feeds it.
type poolPrefix struct {
	cfg   PrefixCache
	pc    *balancer.PrefixCache
	slots map[*balancer.Replica]int
	subs  map[*balancer.Replica]*replicaSub // events mode
	added []int                             // slots this build added (removed again if it fails)
}

// replicaSub is one replica's events subscriber and the endpoint it
// follows.
type replicaSub struct {
	*kvevents.Subscriber
	endpoint, replay string
}

// buildPrefix makes pool pc's prefix index for reps, carrying over prev's
// index (and each replica's slot and subscriber) when its configuration
// is unchanged. It touches no live replica or pool: applyPrefix does.
func (f *Fleet) buildPrefix(pc Pool, reps []*balancer.Replica, prev *poolPrefix) (*poolPrefix, error) {
	cfg := pc.Prefix
	if cfg.Mode == PrefixOff {
		return nil, nil
	}
	pp := &poolPrefix{cfg: cfg, slots: map[*balancer.Replica]int{}, subs: map[*balancer.Replica]*replicaSub{}}
	if prev != nil && prev.cfg == cfg {
		pp.pc = prev.pc
	} else {
		prev = nil
		pp.pc = &balancer.PrefixCache{Index: prefixcache.NewIndex(), BlockSize: cfg.BlockSize, Approximate: cfg.Mode == PrefixApproximate}
		if pp.pc.BlockSize == 0 {
			pp.pc.BlockSize = DefaultPrefixBlockSize
		}
		if cfg.Mode == PrefixEvents {
			tok, chat, err := prefixTokenizer(cfg.Tokenizer)
			if err != nil {
				return nil, fmt.Errorf("prefix_cache.tokenizer: %w", err)
			}
			// Chat resends its history each turn: only the new
			// messages are tokenized.
			pp.pc.Tokenizer, pp.pc.Chat = prefixcache.NewMemo(tok, 0, 0), chat
		} else {
			pp.pc.BlockSize = prefixcache.DefaultBlockBytes
		}
	}
	idx := pp.pc.Index
	for _, r := range reps {
		if prev != nil {
			if s, ok := prev.slots[r]; ok {
				pp.slots[r] = s
				continue
			}
		}
		s, err := idx.Add(r.Name(), defaultPrefixCapacityTokens/blockTokens(pp.pc))
		if err != nil {
			pp.undo()
			return nil, fmt.Errorf("prefix_cache: replica %s: %w", r.Name(), err)
		}
		pp.slots[r], pp.added = s, append(pp.added, s)
	}
	if cfg.Mode != PrefixEvents {
		return pp, nil
	}
	for _, r := range reps {
		ep, err := kvevents.ExpandEndpoint(cfg.KVEvents.Endpoint, r.URL())
		if err != nil {
			pp.undo()
			return nil, fmt.Errorf("kv_events.endpoint: %w", err)
		}
		var replay string
		if cfg.KVEvents.ReplayEndpoint != "" {
			if replay, err = kvevents.ExpandEndpoint(cfg.KVEvents.ReplayEndpoint, r.URL()); err != nil {
				pp.undo()
				return nil, fmt.Errorf("kv_events.replay_endpoint: %w", err)
			}
		}
		if prev != nil {
			if old := prev.subs[r]; old != nil && old.endpoint == ep && old.replay == replay {
				pp.subs[r] = old
				continue
			}
		}
		sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
			Pool: pc.Model, Replica: r.Name(), Endpoint: ep, ReplayEndpoint: replay, Topic: cfg.KVEvents.Topic,
			// Block size 0 (the engines'): every size is indexed, and
			// the requests' keys are cut in the one the engines report.
			Sink:    prefixcache.NewTracker(idx, pp.slots[r], cfg.BlockSize, 0),
			Metrics: f.opts.KVEventsMetrics, Log: f.opts.Log,
		})
		if err != nil {
			pp.undo()
			return nil, fmt.Errorf("kv_events: replica %s: %w", r.Name(), err)
		}
		pp.subs[r] = &replicaSub{Subscriber: sub, endpoint: ep, replay: replay}
	}
	return pp, nil
}

// undo removes the slots a failed build added to a live index.
func (pp *poolPrefix) undo() {
	for _, s := range pp.added {
		pp.pc.Index.Remove(s)
	}
}

// applyPrefix gives pool and its replicas their prefix index (pp nil:
// none), and forgets in prev's index the replicas pp no longer has. Only
// once nothing can fail.
func (f *Fleet) applyPrefix(pool *balancer.Pool, reps []*balancer.Replica, pp, prev *poolPrefix) {
	if pp == nil {
		pool.SetPrefixCache(nil)
		for _, r := range reps {
			r.SetPrefixSlot(-1)
		}
	} else {
		for r, s := range pp.slots {
			r.SetPrefixSlot(s)
		}
		for r, sub := range pp.subs {
			if prev != nil && prev.pc == pp.pc && prev.subs[r] != nil && prev.subs[r] != sub {
				// A new subscriber rebuilds the replica's entries from
				// the engine's replay: drop what the old one knew.
				pp.pc.Index.Clear(pp.slots[r])
			}
		}
		pool.SetPrefixCache(pp.pc)
	}
	if prev == nil {
		return
	}
	for r, s := range prev.slots {
		if pp == nil || pp.pc != prev.pc {
			break // the old index goes with its state
		}
		if _, kept := pp.slots[r]; !kept {
			prev.pc.Index.Remove(s)
		}
	}
	for r := range prev.subs {
		if pp == nil || pp.subs[r] != prev.subs[r] {
			f.opts.KVEventsMetrics.Forget(pool.Model(), r.Name())
		}
	}
}

// prefixTelemetry bounds a replica's index entries by what its engine
// reports it can hold, and gives a pool whose block size is the engines'
// the one its engine reports (vllm:cache_config_info), as the scrapes
// arrive.
type prefixTelemetry struct {
	gpu.Sink
	pc      *balancer.PrefixCache
	slot    int
	learn   bool // the pool's block size is the engines' (PrefixCache.BlockSize 0)
	replica string
	log     *zap.Logger
	// rep is the replica, whose placements (balancer.Replica.PrefixStats)
	// an approximate index ages against the engine's writes.
	rep *balancer.Replica
	// The poller's goroutine only:
	last   int  // the capacity last set, in keys
	warned bool // the engine's block size differs from the pool's, said once
	writes writeBalance
}

// writeBalance is what an approximate index has not seen of one engine's
// cache: the prompt tokens the engine computed and stored (its prefix
// cache's queried less hit tokens) beyond the uncached tokens of the
// requests this router placed there. With other routers in front of the
// same engines, each router's own placements are a share of what the
// engine stores, and its index would keep blocks the engine has long
// evicted; the difference ages the index (prefixcache.Index.Age).
type writeBalance struct {
	seen        bool
	engine, own float64 // the counters at the previous scrape
	tokens      float64 // the engine's writes not yet aged; negative: the router's placements ahead of the engine
}

// step takes one scrape's counters: the tokens to age the index by now
// (≥ 0), and whether the engine's counters went back (it restarted, and
// its cache is empty).
func (b *writeBalance) step(engine, own float64) (age float64, restarted bool) {
	if !b.seen || engine < b.engine {
		restarted = b.seen
		*b = writeBalance{seen: true, engine: engine, own: own}
		return 0, restarted
	}
	de, do := engine-b.engine, max(own-b.own, 0)
	b.engine, b.own = engine, own
	// The router counts a placement when it sends it, the engine when it
	// schedules the prefill: a placement may be a scrape ahead, not more
	// (one the engine never served — shed, failed — must not hide
	// another router's writes for good).
	b.tokens = max(b.tokens+de-do, -do)
	if b.tokens <= 0 {
		return 0, false
	}
	age, b.tokens = b.tokens, 0
	return age, false
}

func (s *prefixTelemetry) StoreEngine(e *gpu.EngineStats) {
	s.Sink.StoreEngine(e)
	if e == nil {
		return
	}
	if s.learn && e.KVBlockSize > 0 && !s.pc.LearnBlockSize(e.KVBlockSize) && !s.warned {
		s.warned = true
		s.log.Warn("fleet: prefix index: replica's block size differs from its pool's: its cache is never matched",
			zap.String("replica", s.replica), zap.Int("block_size", e.KVBlockSize), zap.Int("pool_block_size", s.pc.Block()))
	}
	if e.KVCapacityTokens > 0 {
		if n := max(e.KVCapacityTokens/blockTokens(s.pc), 1); n != s.last {
			s.last = n
			s.pc.Index.SetCapacity(s.slot, n)
		}
	}
	if s.pc.Approximate && s.rep != nil && e.Reported.Has(gpu.FieldPrefixCache) {
		s.age(e)
	}
}

// age ages the replica's entries in an approximate index by the engine's
// writes its placements do not account for, and drops them all when the
// engine restarted.
func (s *prefixTelemetry) age(e *gpu.EngineStats) {
	var own float64
	if st := s.rep.PrefixStats(); st != nil {
		own = float64(st.PromptTokens - st.CachedTokens)
	}
	tokens, restarted := s.writes.step(e.PrefixCacheQueries-e.PrefixCacheHits, own)
	if restarted {
		s.pc.Index.Clear(s.slot)
		s.log.Info("fleet: prefix index: replica's engine restarted (its prefix-cache counters went back): its entries dropped",
			zap.String("replica", s.replica))
		return
	}
	if n := int(tokens) / blockTokens(s.pc); n > 0 {
		s.pc.Index.Age(s.slot, n)
		s.writes.tokens += tokens - float64(n*blockTokens(s.pc)) // a part block waits for the next
	}
}

// prefixSink wraps a replica's telemetry sink when its pool has an index.
func (st *state) prefixSink(pool int, r *balancer.Replica, sink gpu.Sink, log *zap.Logger) gpu.Sink {
	if pool >= len(st.prefix) || st.prefix[pool] == nil {
		return sink
	}
	pp := st.prefix[pool]
	s, ok := pp.slots[r]
	if !ok {
		return sink
	}
	return &prefixTelemetry{Sink: sink, pc: pp.pc, slot: s, replica: r.Name(), rep: r, log: log,
		learn: pp.cfg.Mode == PrefixEvents && pp.cfg.BlockSize == 0}
}

// logPrefix says once per pool how its index is fed.
func (f *Fleet) logPrefix(model string, pp *poolPrefix) {
	if pp == nil {
		return
	}
	f.opts.Log.Info("fleet: prefix index", zap.String("pool", model), zap.String("mode", string(pp.cfg.Mode)),
		zap.Int("replicas", len(pp.slots)), zap.Int("subscribers", len(pp.subs)))
}
