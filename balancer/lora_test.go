package balancer_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
)

// scoringPolicies are the policies that place a request for a LoRA
// adapter by where the adapter is.
var scoringPolicies = []string{"predictive", "least_loaded", "kv_aware", "least_tokens"}

// loraPool builds a pool of n replicas on clock c whose engines report
// max_lora slots and nothing running.
func loraPool(t testing.TB, c *fakeClock, policy string, n, slots int, lc balancer.LoRAConfig) (*balancer.Pool, []*balancer.Replica) {
	t.Helper()
	rs := replicas(t, c, n)
	p, err := balancer.NewPool(balancer.PoolConfig{Model: "base", Aliases: []string{"base-alias"}, Policy: policy, LoRA: lc}, rs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		reportLoRA(r, c, gpu.LoRAStats{MaxLoRAs: slots})
	}
	return p, rs
}

// reportLoRA stores an engine report with the LoRA state l, idle otherwise.
func reportLoRA(r *balancer.Replica, c *fakeClock, l gpu.LoRAStats) {
	s := &gpu.EngineStats{At: c.now(), Reported: gpu.FieldRunning | gpu.FieldWaiting, LoRA: l}
	if l.MaxLoRAs > 0 {
		s.Reported |= gpu.FieldLoRA
	}
	r.StoreEngine(s)
}

// place picks for a request naming model and leases the replica with the
// adapter, as the proxy does; the lease is returned to end it.
func place(t testing.TB, p *balancer.Pool, c *fakeClock, model string) (*balancer.Replica, balancer.Lease) {
	t.Helper()
	req := &balancer.Request{Model: model, Now: c.now(), PromptTokens: 500, OutputTokens: 50}
	r := p.Pick(req)
	if r == nil {
		t.Fatalf("no replica for %s", model)
	}
	l, err := r.AcquireRequest(balancer.LeaseCost{Adapter: p.AdapterOf(model), PromptTokens: 500, OutputTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	return r, l
}

// Golden: vLLM's own vllm:lora_requests_info text, several series each,
// read as the newest says. r0 (vllm_lora.txt, max_lora 2) runs alpaca now
// (underdog only in an older series); r1 (vllm_lora_split.txt, max_lora 4)
// has eight adapters with requests, so any other must wait there; r2
// (vllm_v1.txt) reports no LoRA state and is routed as before.
func TestLoRAGoldenReports(t *testing.T) {
	for _, policy := range scoringPolicies {
		t.Run(policy, func(t *testing.T) {
			c := newFakeClock()
			rs := replicas(t, c, 3)
			p, err := balancer.NewPool(balancer.PoolConfig{Model: "base", Policy: policy}, rs)
			if err != nil {
				t.Fatal(err)
			}
			for i, f := range []string{"vllm_lora.txt", "vllm_lora_split.txt", "vllm_v1.txt"} {
				text, err := os.ReadFile("../gpu/testdata/" + f)
				if err != nil {
					t.Fatal(err)
				}
				s, err := gpu.ParseEngineMetrics(text)
				if err != nil {
					t.Fatal(err)
				}
				// The same load everywhere: only the adapters differ.
				s.Running, s.Waiting, s.KVUsage, s.At = 0, 0, 0, c.now()
				rs[i].StoreEngine(s)
			}
			// The reports taught the pool the adapters they name.
			if got := p.Adapters(); !slices.Equal(got, []string{"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "alpaca"}) {
				t.Fatalf("adapters learned: %v", got)
			}
			for _, tt := range []struct {
				model string
				want  []string // the replicas it may go to
			}{
				{"alpaca", []string{"r0"}},         // running there
				{"a6", []string{"r1"}},             // running there
				{"underdog", []string{"r0", "r2"}}, // a free slot on r0; r2 knows nothing; r1 would evict
				{"base", []string{"r0", "r1", "r2"}},
			} {
				for range 6 {
					req := &balancer.Request{Model: tt.model, Now: c.now()}
					if got := p.Pick(req); got == nil || !slices.Contains(tt.want, got.Name()) {
						t.Fatalf("%s went to %v, want one of %v", tt.model, got, tt.want)
					}
				}
			}
		})
	}
}

// An adapter resident on a replica (the router placed a request for it
// there last) draws the next request for it, though that replica is as
// loaded as the others; an adapter the replica's /v1/models does not list
// never goes there while another replica has it.
func TestLoRAResidentPreferred(t *testing.T) {
	for _, policy := range scoringPolicies {
		t.Run(policy, func(t *testing.T) {
			c := newFakeClock()
			p, rs := loraPool(t, c, policy, 4, 4, balancer.LoRAConfig{})
			// Each replica served one adapter, done since.
			for i, r := range rs {
				l, err := r.AcquireRequest(balancer.LeaseCost{Adapter: fmt.Sprintf("ad%d", i)})
				if err != nil {
					t.Fatal(err)
				}
				c.advance(time.Millisecond)
				l.Done(nil)
			}
			for i := range rs {
				model := fmt.Sprintf("ad%d", i)
				for range 4 {
					if got := p.Pick(&balancer.Request{Model: model, Now: c.now()}); got != rs[i] {
						t.Fatalf("%s went to %v, want r%d where it is resident", model, got, i)
					}
				}
			}
			rs[0].SetAdapters([]string{"ad0"})
			rs[1].SetAdapters([]string{"ad0", "other"})
			for range 8 {
				if got := p.Pick(&balancer.Request{Model: "other", Now: c.now()}); got == rs[0] {
					t.Fatalf("other went to r0, which does not serve it")
				}
			}
		})
	}
}

// A replica whose slots all hold adapters with requests makes a request
// for another adapter wait: it goes to a replica with a free slot, though
// that one carries more requests.
func TestLoRAFreeSlotBeforeEvict(t *testing.T) {
	for _, policy := range scoringPolicies {
		t.Run(policy, func(t *testing.T) {
			c := newFakeClock()
			p, rs := loraPool(t, c, policy, 2, 2, balancer.LoRAConfig{})
			for _, a := range []string{"a", "b"} { // r0: both slots busy
				if _, err := rs[0].AcquireRequest(balancer.LeaseCost{Adapter: a}); err != nil {
					t.Fatal(err)
				}
			}
			for range 3 { // r1: one adapter, more requests
				if _, err := rs[1].AcquireRequest(balancer.LeaseCost{Adapter: "c"}); err != nil {
					t.Fatal(err)
				}
			}
			if got := p.Pick(&balancer.Request{Model: "d", Now: c.now()}); got != rs[1] {
				t.Fatalf("d went to %v, want r1 (a free slot)", got)
			}
			// The engine's report counts too: a third adapter with requests
			// on r1, from another router.
			reportLoRA(rs[1], c, gpu.LoRAStats{MaxLoRAs: 2, Running: []string{"e"}})
			reportLoRA(rs[0], c, gpu.LoRAStats{MaxLoRAs: 2})
			if got := p.Pick(&balancer.Request{Model: "e", Now: c.now()}); got != rs[1] {
				t.Fatalf("e went to %v, want r1 where the engine runs it", got)
			}
		})
	}
}

// A hot adapter spreads: every request is for it, each one stays, and
// once the replica that runs it is at the load bound the next goes to a
// replica with a free slot — it then runs there too. No replica's share
// passes 1.5× its capacity's.
func TestLoRAHotAdapterSpreads(t *testing.T) {
	for _, policy := range scoringPolicies {
		t.Run(policy, func(t *testing.T) {
			c := newFakeClock()
			p, rs := loraPool(t, c, policy, 4, 4, balancer.LoRAConfig{})
			got := map[string]int{}
			const n = 80
			for range n {
				r, _ := place(t, p, c, "hot")
				got[r.Name()]++
			}
			if len(got) < 2 {
				t.Fatalf("the hot adapter stayed on one replica: %v", got)
			}
			for name, k := range got {
				if share := float64(k) / n; share > 1.5/float64(len(rs)) {
					t.Fatalf("%s took %.0f%% of the requests: %v", name, 100*share, got)
				}
			}
		})
	}
}

// Under the load bound a hot adapter stays where it runs: with a mix of
// requests, those for the adapter concentrate on the replicas that run it.
func TestLoRAStickyWithinBound(t *testing.T) {
	c := newFakeClock()
	p, _ := loraPool(t, c, "predictive", 4, 2, balancer.LoRAConfig{})
	where := map[string]map[string]bool{}
	var leases []balancer.Lease
	for i := range 64 {
		model := fmt.Sprintf("ad%d", i%8)
		r, l := place(t, p, c, model)
		if where[model] == nil {
			where[model] = map[string]bool{}
		}
		where[model][r.Name()] = true
		leases = append(leases, l)
		if len(leases) > 12 { // requests end as others come
			leases[0].Done(nil)
			leases = leases[1:]
		}
		c.advance(10 * time.Millisecond)
	}
	spread := 0
	for _, rs := range where {
		spread += len(rs)
	}
	// Eight adapters over four replicas of two slots: one replica each,
	// give or take a spill.
	if spread > 12 {
		t.Fatalf("adapters over %d replica-slots, want about 8: %v", spread, where)
	}
}

// lora.aware off (Blind): the adapter's place counts for nothing, and the
// requests for a resident adapter spread as any request does.
func TestLoRABlind(t *testing.T) {
	c := newFakeClock()
	p, rs := loraPool(t, c, "least_loaded", 4, 4, balancer.LoRAConfig{Blind: true})
	l, err := rs[2].AcquireRequest(balancer.LeaseCost{Adapter: "x"})
	if err != nil {
		t.Fatal(err)
	}
	l.Done(nil)
	got := map[string]int{}
	for range 8 {
		r, _ := place(t, p, c, "x")
		got[r.Name()]++
	}
	if len(got) != 4 {
		t.Fatalf("blind: %v, want every replica", got)
	}
}

// The pool's adapters: declared ones at once, learned ones added, never
// the base model or an alias; AdapterOf says what a request's model asks.
func TestLoRACatalog(t *testing.T) {
	c := newFakeClock()
	p, _ := loraPool(t, c, "predictive", 1, 1, balancer.LoRAConfig{Adapters: []string{"z", "a"}})
	p.LearnAdapters([]string{"base", "base-alias", "m", "a", ""})
	if got := p.Adapters(); !slices.Equal(got, []string{"a", "m", "z"}) {
		t.Fatalf("adapters: %v", got)
	}
	for model, want := range map[string]string{"base": "", "base-alias": "", "": "", "m": "m", "unknown": "unknown"} {
		if got := p.AdapterOf(model); got != want {
			t.Fatalf("AdapterOf(%q) = %q, want %q", model, got, want)
		}
	}
	if !p.HasAdapter("z") || p.HasAdapter("base") || p.HasAdapter("unknown") {
		t.Fatal("HasAdapter wrong")
	}
}

// Placing a request for an adapter allocates nothing, on every scoring
// policy.
func TestLoRAPickAllocs(t *testing.T) {
	for _, policy := range scoringPolicies {
		c := newFakeClock()
		p, rs := loraPool(t, c, policy, 4, 4, balancer.LoRAConfig{})
		reportLoRA(rs[1], c, gpu.LoRAStats{MaxLoRAs: 4, Running: []string{"a", "b"}, Waiting: []string{"c"}})
		// rs[2]'s batch is bound by its slots: a joins it.
		rs[2].StoreEngine(&gpu.EngineStats{At: c.now(), Waiting: 9, Reported: gpu.FieldRunning | gpu.FieldWaiting | gpu.FieldLoRA,
			LoRA: gpu.LoRAStats{MaxLoRAs: 4, Running: []string{"a", "b", "c", "d"}, Waiting: []string{"e"}}})
		place(t, p, c, "a")
		req := &balancer.Request{Model: "a", Now: c.now(), PromptTokens: 500, OutputTokens: 50}
		if n := testing.AllocsPerRun(200, func() { p.Pick(req) }); n != 0 {
			t.Fatalf("%s: %v allocs per Pick", policy, n)
		}
	}
}

func BenchmarkPickLoRA(b *testing.B) {
	c := newFakeClock()
	p, rs := loraPool(b, c, "predictive", 8, 4, balancer.LoRAConfig{})
	for i, r := range rs {
		reportLoRA(r, c, gpu.LoRAStats{MaxLoRAs: 4, Running: []string{fmt.Sprintf("a%d", i), fmt.Sprintf("a%d", i+8)}})
	}
	req := &balancer.Request{Model: "a3", Now: c.now(), PromptTokens: 500, OutputTokens: 50}
	b.ReportAllocs()
	for b.Loop() {
		p.Pick(req)
	}
}

// A replica where adapters wait for a slot lets the slot of its adapter
// with the fewest requests go: that adapter's next request takes a free
// slot elsewhere, so the one waiting gets a slot as it drains.
func TestLoRAYieldsSlotToWaiting(t *testing.T) {
	for _, policy := range scoringPolicies {
		t.Run(policy, func(t *testing.T) {
			c := newFakeClock()
			p, rs := loraPool(t, c, policy, 2, 2, balancer.LoRAConfig{})
			for _, a := range []string{"hot", "hot", "hot", "hot", "rare", "waiting"} {
				if _, err := rs[0].AcquireRequest(balancer.LeaseCost{Adapter: a}); err != nil {
					t.Fatal(err)
				}
			}
			for range 6 { // r1 busier, one adapter
				if _, err := rs[1].AcquireRequest(balancer.LeaseCost{Adapter: "other"}); err != nil {
					t.Fatal(err)
				}
			}
			if got := p.Pick(&balancer.Request{Model: "rare", Now: c.now()}); got != rs[1] {
				t.Fatalf("rare went to %v, want r1's free slot", got)
			}
			if got := p.Pick(&balancer.Request{Model: "hot", Now: c.now()}); got != rs[0] {
				t.Fatalf("hot went to %v, want r0 where it runs", got)
			}
		})
	}
}
