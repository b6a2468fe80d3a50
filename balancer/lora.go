package balancer

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// LoRA adapters. vLLM serves fine-tuned adapters of its base model under
// their own names: a request names its adapter as its model, and the
// engine runs it only once the adapter sits in one of its max_lora GPU
// slots. A batch holds requests of at most max_lora distinct adapters, so a
// request whose adapter is not among those running waits, and one whose
// adapter is not in a slot makes the engine swap it in (from its CPU
// cache, or from disk) in the step that needs it. A router blind to this
// hands every replica every adapter and keeps them swapping; one that
// knows sends a request where its adapter runs or sits in a slot, then
// where a slot is free, and only then where another adapter must make
// room — within the bounded-load limit, so that a hot adapter spreads to
// more replicas instead of overloading the one that has it.
//
// What the router knows of a replica's adapters: the engine's
// vllm:lora_requests_info (the adapters with requests there, and
// max_lora; EngineLoad.LoRAMax, loraActive), the adapters its /v1/models
// lists (SetAdapters), and its own placements (loraTable): which adapters
// it has in flight there, and which it used there last — the engine's
// slots are an LRU, so those are the ones likely still resident.

// LoRAConfig is how a pool serves LoRA adapters of its base model. The zero
// value declares none (the pool learns them from its replicas) and places
// adapter requests knowing where each adapter is.
type LoRAConfig struct {
	// Adapters are adapter names routed to the pool before any replica
	// reports them (its /v1/models, or its metrics).
	Adapters []string
	// Blind places a request for an adapter as one for the base model:
	// no preference for the replicas that hold it. For engines whose
	// adapter swaps cost nothing, or to measure what awareness is worth.
	Blind bool
	// LoadOnDemand has the router load an adapter on the replica a
	// request for it is placed on when that replica is not known to serve
	// it, through the engine's runtime API (vLLM's POST
	// /v1/load_lora_adapter, with VLLM_ALLOW_RUNTIME_LORA_UPDATING), before
	// the request goes there. Only adapters with a path in Paths are
	// loaded; false never loads (a replica without the adapter answers
	// 404). The proxy does the loading; placement here ranks such a
	// replica after those that serve the adapter (tierLoad).
	LoadOnDemand bool
	// Paths is where each adapter's weights live, as the engine reads
	// them (vLLM's lora_path): adapter name → path. nil: none known.
	Paths map[string]string
	// LoadTimeout bounds one load call; 0 means DefaultLoRALoadTimeout.
	LoadTimeout time.Duration
	// LoadBackoff is how long a replica whose load of an adapter failed
	// is not asked to load it again; 0 means DefaultLoRALoadBackoff.
	LoadBackoff time.Duration
}

// The load-on-demand defaults (LoRAConfig.LoadTimeout, LoadBackoff). A
// load reads the adapter from disk or a store and holds the engine up
// meanwhile: seconds, not minutes. The backoff is what keeps a broken
// runtime API (updating disabled, a wrong path) from being asked again
// by every request for the adapter.
const (
	DefaultLoRALoadTimeout = 30 * time.Second
	DefaultLoRALoadBackoff = 30 * time.Second
)

// Loadable reports whether the router loads adapter name on demand: the
// pool loads on demand and knows the adapter's path.
func (c *LoRAConfig) Loadable(name string) bool {
	return c.LoadOnDemand && c.Paths[name] != ""
}

// Adapter tiers: how well a replica suits a request for an adapter, lower
// better. A replica that reports no LoRA state is tierNeutral for every
// adapter, so a pool without LoRA metrics is routed as before.
const (
	tierRunning  = iota // the adapter has requests there: it joins their batch
	tierResident        // in one of its slots, by the router's placements: no swap
	tierNeutral         // a slot is free: a swap, no wait (or nothing known)
	tierEvict           // every slot's adapter has requests: it waits for one to drain
	// With load on demand (LoRAConfig.Loadable) only:
	tierLoad        // not known to serve the adapter: the router loads it there first
	tierCrowded     // serves it but is over the load bound: a load elsewhere spreads it
	tierLoadCrowded // a load, on a replica over the load bound
	tierAbsent      // its /v1/models does not list the adapter: the engine answers 404
)

// loraTracked is how many adapters the router follows per replica:
// several times max_lora in practice, so those still in slots are all
// among them.
const loraTracked = 32

// loraTable is the router's own record of the adapters it placed on one
// replica: per adapter key, its requests in flight there and when one was
// last placed or finished there (unix nanos). Readers (Pick) load the
// atomics without a lock; writers (leases) hold mu, so that two never
// claim one entry.
type loraTable struct {
	mu sync.Mutex
	e  [loraTracked]loraEntry
	// registered is the adapters the replica's /v1/models lists, sorted
	// keys; nil: not known (every adapter is assumed there).
	registered atomic.Pointer[[]uint64]
	// loaded is the adapters the router loaded there since /v1/models
	// was last read (sorted keys; nil none): the next read, which lists
	// them if the engine still has them, replaces it.
	loaded atomic.Pointer[[]uint64]
	// loadMu orders writers of loaded.
	loadMu sync.Mutex
}

type loraEntry struct {
	key      atomic.Uint64 // adapterKey; 0: free
	inFlight atomic.Int32
	last     atomic.Int64
}

// adapterKey is an adapter name's key in the tables: never 0 (free).
func adapterKey(name string) uint64 { return max(hashString(name), 1) }

// acquire counts a request for key placed at nowNs.
func (t *loraTable) acquire(key uint64, nowNs int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	free, idle := -1, -1
	for i := range t.e {
		e := &t.e[i]
		switch k := e.key.Load(); {
		case k == key:
			e.inFlight.Add(1)
			e.last.Store(nowNs)
			return
		case k == 0:
			if free < 0 {
				free = i
			}
		case e.inFlight.Load() == 0:
			if idle < 0 || e.last.Load() < t.e[idle].last.Load() {
				idle = i
			}
		}
	}
	at := free // else the entry idle longest
	if at < 0 {
		at = idle
	}
	if at < 0 {
		return // every entry has requests in flight: this one goes unrecorded
	}
	e := &t.e[at]
	e.key.Store(key)
	e.inFlight.Store(1)
	e.last.Store(nowNs)
}

// release ends a request for key at nowNs: the adapter was in a slot then.
func (t *loraTable) release(key uint64, nowNs int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.e {
		if t.e[i].key.Load() == key {
			if t.e[i].inFlight.Load() > 0 {
				t.e[i].inFlight.Add(-1)
			}
			t.e[i].last.Store(nowNs)
			return
		}
	}
}

// slotState is an adapter's place on a replica by the router's count.
type slotState struct {
	own      int32 // the adapter's requests in flight there
	resident bool  // among the slots adapters the router used there most recently
	active   int   // distinct adapters with requests in flight there
	fewest   int32 // the fewest requests in flight one of those has (0: none has any)
}

// state reads key's place on the replica (slotState); the engine's report
// adds its own in slotTier.
func (t *loraTable) state(key uint64, slots int) slotState {
	var s slotState
	var last int64 = -1
	for i := range t.e {
		e := &t.e[i]
		k := e.key.Load()
		if k == 0 {
			continue
		}
		n := e.inFlight.Load()
		if n > 0 {
			s.active++
			if s.fewest == 0 || n < s.fewest {
				s.fewest = n
			}
		}
		if k == key {
			s.own, last = n, e.last.Load()
		}
	}
	if last < 0 {
		return s
	}
	newer := 0
	for i := range t.e {
		e := &t.e[i]
		if k := e.key.Load(); k != 0 && k != key && e.last.Load() > last {
			newer++
		}
	}
	s.resident = newer < slots
	return s
}

// inFlightOf reports whether the router has requests for key in flight.
func (t *loraTable) inFlightOf(key uint64) bool {
	for i := range t.e {
		if e := &t.e[i]; e.key.Load() == key {
			return e.inFlight.Load() > 0
		}
	}
	return false
}

// SetAdapters records the adapters the replica's engine serves (its
// /v1/models entries with a parent); nil means not known. The list
// replaces what the router loaded there (AdapterLoaded): it is the
// engine's word, and an adapter it lost (a restart) is loaded again. A
// list read just before a load ended misses that load: the next request
// loads it again, which the engine answers as already loaded.
func (r *Replica) SetAdapters(names []string) {
	r.lora.loadMu.Lock()
	defer r.lora.loadMu.Unlock()
	r.lora.loaded.Store(nil)
	if names == nil {
		r.lora.registered.Store(nil)
		return
	}
	keys := make([]uint64, len(names))
	for i, n := range names {
		keys[i] = adapterKey(n)
	}
	slices.Sort(keys)
	r.lora.registered.Store(&keys)
}

// AdapterLoaded records that the router loaded adapter name on the
// replica (or found it already loaded): it serves it from now on, until
// its /v1/models says otherwise (SetAdapters).
func (r *Replica) AdapterLoaded(name string) {
	k := adapterKey(name)
	r.lora.loadMu.Lock()
	defer r.lora.loadMu.Unlock()
	var next []uint64
	if cur := r.lora.loaded.Load(); cur != nil {
		if _, ok := slices.BinarySearch(*cur, k); ok {
			return
		}
		next = slices.Clone(*cur)
	}
	next = append(next, k)
	slices.Sort(next)
	r.lora.loaded.Store(&next)
}

// HasAdapter reports whether the replica is known to serve adapter name:
// its /v1/models listed it, or the router loaded it there since.
func (r *Replica) HasAdapter(name string) bool { return r.knowsAdapter(adapterKey(name)) }

// knowsAdapter is HasAdapter by key.
func (r *Replica) knowsAdapter(key uint64) bool {
	if l := r.lora.loaded.Load(); l != nil {
		if _, ok := slices.BinarySearch(*l, key); ok {
			return true
		}
	}
	reg := r.lora.registered.Load()
	if reg == nil {
		return false
	}
	_, ok := slices.BinarySearch(*reg, key)
	return ok
}

// servesAdapter reports whether the replica is known not to serve key
// (false) or may (true).
func (r *Replica) servesAdapter(key uint64) bool {
	return r.lora.registered.Load() == nil || r.knowsAdapter(key)
}

// loraMatch is a request's adapter as its pool resolved it, once.
type loraMatch struct {
	looked   bool
	key      uint64 // adapterKey; 0 for the base model
	aware    bool   // the pool places it knowing where adapters are
	loadable bool   // the router loads it where it is placed (LoRAConfig.Loadable)
}

// tier rates c for r's adapter (tierRunning … tierAbsent): tierNeutral
// for a request for the base model, a blind pool, or a replica that
// reports no LoRA state. bound is the bounded-load limit: over it, a
// replica loses its advantage (the adapter running or resident there),
// not its drawbacks. For tierEvict, wait orders the replicas by how soon
// a slot may free there (lower sooner): the adapters there beyond its
// slots, which wait for one first, then the fewest requests one of its
// adapters has — the one to drain first.
//
// An adapter the router loads on demand ranks a replica not known to
// serve it after every one that does (tierLoad: a load holds the engine
// up, and each replica that serves an adapter is one more to share its
// slots), but a replica that serves it over the bound after a load
// within it (tierCrowded), so that a hot adapter spreads to another
// replica instead of piling onto the one that has it.
func (r *Request) tier(c *Replica, e *EngineLoad, bound float64) (tier int, wait float64) {
	if !r.lora.aware || r.lora.key == 0 {
		return tierNeutral, 0
	}
	over := float64(c.inFlight.Load()+1)/c.capacity() > bound
	if r.lora.loadable {
		switch known := c.knowsAdapter(r.lora.key); {
		case !known && over:
			return tierLoadCrowded, 0
		case !known:
			return tierLoad, 0
		case over:
			return tierCrowded, 0
		}
	} else if !c.servesAdapter(r.lora.key) {
		return tierAbsent, 0
	}
	if e == nil || e.LoRAMax <= 0 {
		return tierNeutral, 0
	}
	t, wait := c.slotTier(r.lora.key, e)
	if t < tierNeutral && over {
		return tierNeutral, 0
	}
	return t, wait
}

// slotTier is tier without the load bound, for a replica whose engine
// reports e.
func (c *Replica) slotTier(key uint64, e *EngineLoad) (int, float64) {
	s := c.lora.state(key, e.LoRAMax)
	active := s.active
	if s.own > 0 && active > e.LoRAMax && s.own <= s.fewest {
		// Adapters wait for a slot there, and this one has the fewest
		// requests: it lets its slot go — a slot free elsewhere, or the
		// adapter running elsewhere, takes the request instead — else
		// adapters too rare to fill a batch wait behind those that never
		// drain.
		return tierEvict, 0
	}
	if s.own > 0 || slices.Contains(e.loraActive, key) {
		return tierRunning, 0
	}
	for _, k := range e.loraActive {
		if !c.lora.inFlightOf(k) {
			active++ // the engine's, or other routers'
		}
	}
	switch {
	case active >= e.LoRAMax:
		return tierEvict, float64(active-e.LoRAMax)*slotWaitStep + float64(s.fewest)
	case s.resident:
		return tierResident, 0
	}
	return tierNeutral, 0
}

// slotWaitStep is what one adapter waiting for a slot ahead of a request
// weighs against the requests of the adapter to drain first: more than
// any such count.
const slotWaitStep = 1 << 20

// lookupAdapter resolves r's adapter, once: r.Model when it names neither
// the pool's base model nor an alias (the route table sent it here as one
// of the pool's adapters).
func (p *Pool) lookupAdapter(r *Request) {
	if r.lora.looked {
		return
	}
	r.lora.looked = true
	if m := p.AdapterOf(r.Model); m != "" {
		r.lora = loraMatch{looked: true, key: adapterKey(m), aware: !p.cfg.LoRA.Blind, loadable: p.cfg.LoRA.Loadable(m)}
	}
}

// AdapterOf is the LoRA adapter a request naming model asks of the pool:
// model, unless it is empty, the pool's base model or an alias ("").
func (p *Pool) AdapterOf(model string) string {
	if p.adapterName(model) {
		return model
	}
	return ""
}
