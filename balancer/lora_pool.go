package balancer

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpurouter/gpurouter/gpu"
)

// adapterCatalog is the adapters a pool routes, as one immutable value:
// those its configuration declares, those its replicas' /v1/models list
// and those their metrics named. Names are only ever added: a replica
// that stops serving one says so with a 404, which the client reads.
type adapterCatalog struct {
	names map[string]struct{}
	list  []string // sorted
}

// loraCatalog is a pool's adapterCatalog and the lock its writers take.
type loraCatalog struct {
	mu  sync.Mutex
	cat atomic.Pointer[adapterCatalog]
}

// LoRA is the pool's LoRA configuration.
func (p *Pool) LoRA() LoRAConfig { return p.cfg.LoRA }

// HasAdapter reports whether name is one of the pool's LoRA adapters:
// declared, listed by a replica, or seen in a replica's metrics.
func (p *Pool) HasAdapter(name string) bool {
	c := p.lora.cat.Load()
	if c == nil {
		return false
	}
	_, ok := c.names[name]
	return ok
}

// Adapters lists the pool's LoRA adapters, sorted; callers must not
// modify it.
func (p *Pool) Adapters() []string {
	if c := p.lora.cat.Load(); c != nil {
		return c.list
	}
	return nil
}

// LearnAdapters adds names to the pool's adapters: those new are routed
// here from now on. The pool's base model and aliases are not adapters.
func (p *Pool) LearnAdapters(names []string) {
	if !p.newAdapter(names) {
		return
	}
	p.lora.mu.Lock()
	defer p.lora.mu.Unlock()
	old := p.lora.cat.Load()
	next := &adapterCatalog{names: map[string]struct{}{}}
	if old != nil {
		for n := range old.names {
			next.names[n] = struct{}{}
		}
	}
	for _, n := range names {
		if p.adapterName(n) {
			next.names[n] = struct{}{}
		}
	}
	if old != nil && len(next.names) == len(old.names) {
		return
	}
	for n := range next.names {
		next.list = append(next.list, n)
	}
	slices.Sort(next.list)
	p.lora.cat.Store(next)
}

// newAdapter reports whether names holds an adapter the pool does not
// know yet; without allocating, as every scrape asks.
func (p *Pool) newAdapter(names []string) bool {
	for _, n := range names {
		if p.adapterName(n) && !p.HasAdapter(n) {
			return true
		}
	}
	return false
}

// adapterName reports whether n may name one of the pool's adapters.
func (p *Pool) adapterName(n string) bool {
	return n != "" && n != p.cfg.Model && !slices.Contains(p.cfg.Aliases, n)
}

// slotBound reports whether an engine's batch is bound by its adapter
// slots, not by room: it holds max_lora adapters and requests for another
// adapter wait. Its waiting queue is then mostly requests waiting for a
// slot, which a request for a running adapter does not queue behind.
// vLLM up to 0.11 lists running and waiting adapters apart; later
// versions list every adapter with a request in both, which never reads
// as bound.
func slotBound(l gpu.LoRAStats) bool {
	if len(l.Running) < l.MaxLoRAs {
		return false
	}
	for _, w := range l.Waiting {
		if !slices.Contains(l.Running, w) {
			return true
		}
	}
	return false
}

// storeLoRA fills e's LoRA fields from the engine's report and teaches the
// replica's pool the adapters it names.
func (r *Replica) storeLoRA(e *EngineLoad, s *gpu.EngineStats) {
	if !s.Reported.Has(gpu.FieldLoRA) || s.LoRA.MaxLoRAs <= 0 {
		return
	}
	e.LoRAMax = s.LoRA.MaxLoRAs
	e.loraBound = slotBound(s.LoRA)
	for _, n := range s.LoRA.Running {
		e.loraRunning = append(e.loraRunning, adapterKey(n))
	}
	for _, list := range [][]string{s.LoRA.Running, s.LoRA.Waiting} {
		for _, n := range list {
			if k := adapterKey(n); !slices.Contains(e.loraActive, k) {
				e.loraActive = append(e.loraActive, k)
			}
		}
		if p := r.pool.Load(); p != nil {
			p.LearnAdapters(list)
		}
	}
}
