package fleet

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/prefixcache"
)

// slotsOf is each replica's slot in its pool's index, by name.
func slotsOf(t *testing.T, p *balancer.Pool) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, r := range p.Replicas() {
		s, ok := r.PrefixSlot()
		if !ok {
			t.Fatalf("replica %s has no prefix slot", r.Name())
		}
		out[r.Name()] = s
	}
	return out
}

// A pool's index lives as long as its configuration: a reload that
// changes the replicas keeps it (and the slots of the replicas kept),
// frees a removed replica's slot and gives a new one its own; another
// mode builds a new one; off takes it away.
func TestPrefixIndexAcrossChanges(t *testing.T) {
	a, b, c := Replica{Name: "a", URL: "http://127.0.0.1:1"}, Replica{Name: "b", URL: "http://127.0.0.1:2"}, Replica{Name: "c", URL: "http://127.0.0.1:3"}
	spec := onePool(a, b)
	spec.Pools[0].Prefix = PrefixCache{Mode: PrefixApproximate}
	f, tb := newFleet(t, spec)
	pool := tb.last()[0].Pool
	pc := pool.PrefixCache()
	if pc == nil || !pc.Approximate {
		t.Fatalf("prefix cache %+v, want an approximate one", pc)
	}
	before := slotsOf(t, pool)
	pc.Index.Store(before["a"], []uint64{1, 2, 3})

	spec.Pools[0].Replicas = []Replica{a, c}
	if err := f.Reload(spec); err != nil {
		t.Fatal(err)
	}
	pool = tb.last()[0].Pool
	if pool.PrefixCache() != pc {
		t.Fatal("a reload with the same prefix configuration built a new index")
	}
	after := slotsOf(t, pool)
	if after["a"] != before["a"] || pc.Index.Len(after["a"]) != 3 {
		t.Fatalf("replica a: slot %d → %d holding %d, want its slot and blocks kept", before["a"], after["a"], pc.Index.Len(after["a"]))
	}
	if after["c"] == after["a"] || pc.Index.Len(after["c"]) != 0 {
		t.Fatalf("replica c got slot %d holding %d", after["c"], pc.Index.Len(after["c"]))
	}

	spec.Pools[0].Prefix = PrefixCache{Mode: PrefixEvents, KVEvents: KVEvents{Endpoint: "tcp://{host}:{port+100}"}}
	if err := f.Reload(spec); err != nil {
		t.Fatal(err)
	}
	pool = tb.last()[0].Pool
	ev := pool.PrefixCache()
	if ev == nil || ev == pc || ev.Approximate || ev.Tokenizer == nil || ev.BlockSize != DefaultPrefixBlockSize {
		t.Fatalf("events mode: %+v", ev)
	}
	subs := 0
	for _, l := range f.state.Load().loops() {
		if _, ok := l.(interface{ Resync() }); ok {
			subs++
		}
	}
	if subs != 2 {
		t.Fatalf("%d event subscribers running, want one per replica", subs)
	}

	spec.Pools[0].Prefix = PrefixCache{}
	if err := f.Reload(spec); err != nil {
		t.Fatal(err)
	}
	if pc := tb.last()[0].Pool.PrefixCache(); pc != nil {
		t.Fatalf("prefix off: the pool still has %+v", pc)
	}
	for _, r := range tb.last()[0].Pool.Replicas() {
		if _, ok := r.PrefixSlot(); ok {
			t.Fatalf("prefix off: replica %s keeps a slot", r.Name())
		}
	}
}

// Events mode needs an endpoint, and the templates must fill.
func TestPrefixValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		pc   PrefixCache
		want string
	}{
		{"unknown mode", PrefixCache{Mode: "exact"}, "prefix_cache.mode"},
		{"events without endpoint", PrefixCache{Mode: PrefixEvents}, "kv_events.endpoint: required"},
		{"not tcp", PrefixCache{Mode: PrefixEvents, KVEvents: KVEvents{Endpoint: "ipc:///x"}}, "kv_events.endpoint"},
		{"bad port offset", PrefixCache{Mode: PrefixEvents, KVEvents: KVEvents{Endpoint: "tcp://{host}:{port*2}"}}, "kv_events.endpoint"},
		{"replay", PrefixCache{Mode: PrefixEvents, KVEvents: KVEvents{Endpoint: "tcp://{host}:5557", ReplayEndpoint: "tcp://{host}"}}, "kv_events.replay_endpoint"},
		{"tokenizer", PrefixCache{Mode: PrefixEvents, Tokenizer: "llama3", KVEvents: KVEvents{Endpoint: "tcp://{host}:5557"}}, "prefix_cache.tokenizer: must be"},
		{"tokenizer file", PrefixCache{Mode: PrefixEvents, Tokenizer: "/models/none/tokenizer.json", KVEvents: KVEvents{Endpoint: "tcp://{host}:5557"}}, "prefix_cache.tokenizer: stat /models/none/tokenizer.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := onePool(Replica{URL: "http://127.0.0.1:1"})
			s.Pools[0].Prefix = tc.pc
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), "pools[0]."+tc.want) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

// A pool whose block size is the engines' takes the first one an engine
// reports; an engine reporting another is said once, and changes
// nothing. A configured block size is never changed.
func TestPrefixBlockSizeFromTheEngines(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	pc := &balancer.PrefixCache{Index: prefixcache.NewIndex(), BlockSize: DefaultPrefixBlockSize}
	a, err := pc.Index.Add("a", 1000)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pc.Index.Add("b", 1000)
	sink := func(slot int, learn bool) *prefixTelemetry {
		return &prefixTelemetry{Sink: nopSink{}, pc: pc, slot: slot, learn: learn, replica: fmt.Sprint(slot), log: zap.New(core)}
	}
	ta, tb := sink(a, true), sink(b, true)
	keys := make([]uint64, 300)
	for i := range keys {
		keys[i] = uint64(i + 1)
	}
	pc.Index.Store(a, keys)
	// 6,400 tokens of KV: 400 blocks of 16, then 200 of 32.
	ta.StoreEngine(&gpu.EngineStats{KVCapacityTokens: 6400})
	if pc.Block() != 16 || pc.Index.Len(a) != 300 {
		t.Fatalf("before any report: block %d, %d keys; want 16, 300", pc.Block(), pc.Index.Len(a))
	}
	ta.StoreEngine(&gpu.EngineStats{KVCapacityTokens: 6400, KVBlockSize: 32})
	if pc.Block() != 32 || pc.Index.Len(a) != 200 {
		t.Fatalf("after a report of 32: block %d, %d keys; want 32, 200", pc.Block(), pc.Index.Len(a))
	}
	for range 3 {
		tb.StoreEngine(&gpu.EngineStats{KVBlockSize: 16})
	}
	if pc.Block() != 32 || logs.Len() != 1 {
		t.Fatalf("another engine's 16: block %d, %d warnings; want 32, 1", pc.Block(), logs.Len())
	}
	fixed := &balancer.PrefixCache{Index: prefixcache.NewIndex(), BlockSize: 64}
	(&prefixTelemetry{Sink: nopSink{}, pc: fixed, log: zap.New(core)}).StoreEngine(&gpu.EngineStats{KVBlockSize: 16})
	if fixed.Block() != 64 {
		t.Fatalf("a configured block size became %d", fixed.Block())
	}
}

type nopSink struct{}

func (nopSink) StoreEngine(*gpu.EngineStats) {}
func (nopSink) StoreGPU(*gpu.GPUSnapshot)    {}

// tinyTokenizerJSON is a byte-level BPE tokenizer.json: the 256 bytes,
// one merge ("h", "i"), ChatML's tokens.
func tinyTokenizerJSON(t *testing.T) []byte {
	t.Helper()
	vocab := map[string]int{}
	n := 256
	for b := range 256 {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE) {
			r = rune(n)
			n++
		}
		vocab[string(r)] = b
	}
	vocab["hi"] = 256
	data, err := json.Marshal(map[string]any{
		"added_tokens": []any{
			map[string]any{"id": 300, "content": "<|im_start|>", "special": true},
			map[string]any{"id": 301, "content": "<|im_end|>", "special": true},
		},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"h i"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// A tokenizer.json path loads the model's tokenizer and its ChatML
// rendering; a file the loader refuses fails the build, naming the path.
func TestPrefixTokenizerFile(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "unigram.json")
	if err := os.WriteFile(good, tinyTokenizerJSON(t), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(`{"model":{"type":"Unigram","vocab":[["a",0]]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := onePool(Replica{Name: "a", URL: "http://127.0.0.1:1"})
	spec.Pools[0].Prefix = PrefixCache{Mode: PrefixEvents, BlockSize: 16, Tokenizer: good, KVEvents: KVEvents{Endpoint: "tcp://{host}:{port+100}"}}
	f, tb := newFleet(t, spec)
	pc := tb.last()[0].Pool.PrefixCache()
	if pc == nil {
		t.Fatal("no prefix cache")
	}
	// "hi" is one token (256) in the file's vocabulary only.
	ids := pc.Chat.AppendChat(nil, pc.Tokenizer, []prefixcache.Message{{Role: "user", Content: "hi"}})
	// <|im_start|> "user\nhi" <|im_end|> "\n" <|im_start|> "assistant\n"
	if ids[0] != 300 || !slices.Contains(ids, 256) || ids[len(ids)-1] != '\n' {
		t.Fatalf("chat ids %v", ids)
	}

	spec.Pools[0].Prefix.Tokenizer = bad
	err := f.Reload(spec)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "prefix_cache.tokenizer") {
		t.Fatalf("Reload with a Unigram file = %v", err)
	}
}

// An approximate index ages a replica's entries by what its engine
// stored beyond this router's placements (another router's requests):
// with room for 100 blocks of 128 tokens, a placement of 40 blocks stays
// while the engine stores only it, goes once the engine has stored 100
// blocks more than this router sent, and an engine restart (its
// counters back to 0) drops everything.
func TestPrefixApproximateAgesByTheEnginesWrites(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	r, err := balancer.NewReplica(balancer.ReplicaConfig{Name: "a", URL: "http://127.0.0.1:1"}, balancer.BreakerConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m"}, []*balancer.Replica{r})
	if err != nil {
		t.Fatal(err)
	}
	pc := &balancer.PrefixCache{Index: prefixcache.NewIndex(), BlockSize: prefixcache.DefaultBlockBytes, Approximate: true}
	slot, _ := pc.Index.Add("a", 1000)
	pool.SetPrefixCache(pc)
	r.SetPrefixSlot(slot)
	bt := blockTokens(pc)
	tel := &prefixTelemetry{Sink: nopSink{}, pc: pc, slot: slot, replica: "a", rep: r, log: zap.New(core)}
	scrape := func(queried, hits int) {
		tel.StoreEngine(&gpu.EngineStats{KVCapacityTokens: 100 * bt, Reported: gpu.FieldPrefixCache,
			PrefixCacheQueries: float64(queried), PrefixCacheHits: float64(hits)})
	}
	scrape(0, 0)
	keys := make([]uint64, 40)
	for i := range keys {
		keys[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	l, err := r.AcquireRequest(balancer.LeaseCost{PromptTokens: int64(40 * bt), Prefix: keys})
	if err != nil {
		t.Fatal(err)
	}
	l.Done(nil)
	held := make([]int, 1)
	scrape(40*bt, 0) // the engine stored just this placement
	if n := pc.Index.Lookup(keys, held); n != 40 {
		t.Fatalf("the engine stored only this router's placement: %d of 40 blocks held, want 40", n)
	}
	scrape(40*bt+50*bt, 5*bt) // 45 blocks more: the cache has room for them
	if n := pc.Index.Lookup(keys, held); n != 40 {
		t.Fatalf("85 of 100 places used: %d of 40 blocks held, want 40", n)
	}
	scrape(40*bt+110*bt, 5*bt) // 105 more in all: the 40 oldest are gone
	if n := pc.Index.Lookup(keys, held); n != 0 {
		t.Fatalf("the engine stored 105 blocks past this router's 40: %d still held, want 0", n)
	}
	l, _ = r.AcquireRequest(balancer.LeaseCost{PromptTokens: int64(40 * bt), Prefix: keys})
	l.Done(nil)
	scrape(10*bt, 0) // counters went back: a restart
	if n := pc.Index.Len(slot); n != 0 || logs.FilterMessageSnippet("restarted").Len() != 1 {
		t.Fatalf("after the engine restarted: %d blocks held, %d logs; want 0, 1", n, logs.FilterMessageSnippet("restarted").Len())
	}
}
