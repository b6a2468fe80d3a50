package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpurouter/gpurouter/kvevents"
	"github.com/gpurouter/gpurouter/prefixcache"
)

// TestKVEventsIndexEndToEnd is the router's view of a fleet through KV
// events alone: the simulator publishes (map encoding, replay on),
// kvevents.Subscribers follow every replica, prefixcache.Trackers keep one
// index. A long prompt served by replica 2 shows as held there, every full
// block, and nowhere else; after another prompt evicts most of it (a cache
// of 64 blocks), the index says exactly what the engine still has.
func TestKVEventsIndexEndToEnd(t *testing.T) {
	p := mustBuiltin(t, "qwen2.5-7b")
	for k, v := range map[string]string{"num-gpu-blocks-override": "64", "max-model-len": "1024"} {
		if err := p.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	f := startFleet(t, FleetConfig{Replicas: 3, Profiles: []Profile{p}, Speeds: []float64{10}, ServedModelNames: []string{"m"},
		KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
			Topic: "kv@sim", Encoding: kvevents.EncodingMap}})

	idx := prefixcache.NewIndex()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	slots := make([]int, 3)
	for i, r := range f.Replicas() {
		pub, replay := r.KVEventsAddr()
		slot, err := idx.Add(fmt.Sprint(i), r.NumGPUBlocks())
		if err != nil {
			t.Fatal(err)
		}
		slots[i] = slot
		sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Pool: "m", Replica: fmt.Sprint(i),
			Endpoint: pub, ReplayEndpoint: replay, Topic: "kv@",
			Sink: prefixcache.NewTracker(idx, slot, 16, r.NumGPUBlocks()), IdleReplay: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = sub.Run(ctx) }()
	}

	est := testEstimator(t)
	bpe, err := prefixcache.NewBPE("")
	if err != nil {
		t.Fatal(err)
	}
	// The router's side: the prompt's blocks from its own tokenizer and
	// chat rendering.
	keysOf := func(content string) []uint64 {
		ids := prefixcache.CL100KChat().AppendChat(nil, bpe, []prefixcache.Message{{Role: "user", Content: content}})
		return prefixcache.AppendKeys(nil, prefixcache.RootSeed, ids, 16)
	}
	send := func(content string) {
		body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "ignore_eos": true,
			"messages": []map[string]string{{"role": "user", "content": content}}})
		if code, _, b := httpDo(t, "POST", f.URLs()[2]+"/v1/chat/completions", string(body)); code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
	}
	held := make([]int, prefixcache.MaxReplicas)
	lookup := func(keys []uint64) []int {
		idx.Lookup(keys, held)
		return []int{held[slots[0]], held[slots[1]], held[slots[2]]}
	}

	promptA := est.Synthesize(600, 1)
	keysA := keysOf(promptA)
	send(promptA)
	waitFor(t, 10*time.Second, "the index to show prompt A on replica 2", func() bool {
		h := lookup(keysA)
		return h[0] == 0 && h[1] == 0 && h[2] == len(keysA)
	})
	if len(keysA) < 37 {
		t.Fatalf("prompt A has %d full blocks", len(keysA))
	}

	// Prompt B needs 57 of the 64 blocks: most of A's cached blocks go.
	send(est.Synthesize(900, 2))
	r2 := f.Replicas()[2]
	engineHolds := func() int {
		ids := prefixcache.CL100KChat().AppendChat(nil, bpe, []prefixcache.Message{{Role: "user", Content: promptA}})
		hashes := prefixcache.AppendKeys(nil, r2.hashSeed, ids, 16)
		r2.mu.Lock()
		defer r2.mu.Unlock()
		n := 0
		for n < len(hashes) {
			if _, ok := r2.eng.kv.cached[nonzero(hashes[n])]; !ok {
				break
			}
			n++
		}
		return n
	}
	truth := engineHolds()
	t.Logf("prompt A: %d full blocks; the engine keeps %d after prompt B", len(keysA), truth)
	if truth >= len(keysA) {
		t.Fatalf("the engine still holds all %d blocks of A: no pressure", truth)
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("the index to show replica 2 holding %d blocks of A", truth), func() bool {
		return lookup(keysA)[2] == truth
	})
	if idx.Len(slots[2]) > r2.NumGPUBlocks() {
		t.Fatalf("index holds %d blocks for a 64-block cache", idx.Len(slots[2]))
	}
}

// TestKVEventsFaultsOverTheWire: the simulator's fault flags against a
// real subscriber. Dropped batches come back by replay (gaps, no resync)
// and the index ends exactly as the engine's cache; batches lost from the
// replay buffer too force a resync, after which the index claims nothing
// the engine does not hold.
func TestKVEventsFaultsOverTheWire(t *testing.T) {
	for _, tc := range []struct {
		name        string
		faults      Faults
		wantResyncs bool
	}{
		{"dropped and reordered: replayed", Faults{KVEventsDropRate: 0.3, KVEventsReorderRate: 0.2}, false},
		{"lost: resynced", Faults{KVEventsLoseRate: 0.3}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustBuiltin(t, "qwen2.5-7b")
			for k, v := range map[string]string{"num-gpu-blocks-override": "128", "max-model-len": "2048"} {
				if err := p.Set(k, v); err != nil {
					t.Fatal(err)
				}
			}
			f := startFleet(t, FleetConfig{Replicas: 1, Profiles: []Profile{p}, Speeds: []float64{10}, ServedModelNames: []string{"m"},
				Faults: tc.faults, Seed: 7,
				KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}})
			r := f.Replicas()[0]
			idx := prefixcache.NewIndex()
			slot, _ := idx.Add("0", r.NumGPUBlocks())
			reg := prometheus.NewRegistry()
			pub, replay := r.KVEventsAddr()
			sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Pool: "m", Replica: "0", Endpoint: pub, ReplayEndpoint: replay,
				Sink: prefixcache.NewTracker(idx, slot, 16, r.NumGPUBlocks()), Metrics: kvevents.NewMetrics(reg),
				IdleReplay: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = sub.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			est := testEstimator(t)
			bpe, _ := prefixcache.NewBPE("")
			var prompts [][]uint64
			for i := range 12 { // 12 prompts of ~300 tokens through a 128-block cache: stores and evictions
				content := est.Synthesize(300, uint64(100+i))
				body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "ignore_eos": true,
					"messages": []map[string]string{{"role": "user", "content": content}}})
				if code, _, b := httpDo(t, "POST", f.URLs()[0]+"/v1/chat/completions", string(body)); code != 200 {
					t.Fatalf("status %d: %s", code, b)
				}
				ids := prefixcache.CL100KChat().AppendChat(nil, bpe, []prefixcache.Message{{Role: "user", Content: content}})
				prompts = append(prompts, prefixcache.AppendKeys(nil, prefixcache.RootSeed, ids, 16))
			}
			// The engine's truth per prompt, in its own hashes.
			truth := func(keys []uint64, content int) int {
				ids := prefixcache.CL100KChat().AppendChat(nil, bpe, []prefixcache.Message{{Role: "user",
					Content: est.Synthesize(300, uint64(100+content))}})
				hashes := prefixcache.AppendKeys(nil, r.hashSeed, ids, 16)
				r.mu.Lock()
				defer r.mu.Unlock()
				n := 0
				for n < len(hashes) {
					if _, ok := r.eng.kv.cached[nonzero(hashes[n])]; !ok {
						break
					}
					n++
				}
				return n
			}
			held := make([]int, 1)
			waitFor(t, 10*time.Second, "the index to settle", func() bool {
				for i, keys := range prompts {
					idx.Lookup(keys, held)
					want := truth(keys, i)
					if held[0] > want || (!tc.wantResyncs && held[0] != want) {
						return false
					}
				}
				return true
			})
			gaps := counterSum(t, reg, "gpurouter_kv_event_gaps_total")
			resyncs := counterSum(t, reg, "gpurouter_kv_event_resyncs_total")
			if tc.wantResyncs != (resyncs > 0) {
				t.Fatalf("resyncs %v (gaps %v)", resyncs, gaps)
			}
			if !tc.wantResyncs && gaps == 0 && counterSum(t, reg, "gpurouter_kv_event_replays_total") < 2 {
				t.Fatal("faults injected but no gap seen and nothing replayed")
			}
		})
	}
}

func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.Metric {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestPrefixQueriesCountAsVLLM: vLLM counts a lookup every time the
// scheduler tries a waiting request (a request that does not fit yet is
// counted again at the next step), in tokens, and leaves out requests
// resumed after a preemption.
func TestPrefixQueriesCountAsVLLM(t *testing.T) {
	p := mustBuiltin(t, "qwen2.5-7b")
	for k, v := range map[string]string{"num-gpu-blocks-override": "8", "max-model-len": "128"} {
		if err := p.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	m := newEngineMetrics(prometheus.NewRegistry(), metricsOptions{modelName: "m", maxModelLen: 128})
	e, err := newEngine(p, m)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	hashes := func(salt uint64) []uint64 {
		return prefixcache.AppendKeys(nil, salt, make([]uint32, 96), 16)
	}
	// A holds 7 of the 8 blocks while it decodes; B (100 tokens, 7 blocks)
	// waits at the head of the queue.
	e.add(&seq{prompt: 100, target: 5, maxTokens: 5, hashes: hashes(1), sink: &countSink{}, salt: 1}, now)
	e.schedule(now)
	e.complete(now)
	if e.prefixQueries != 100 {
		t.Fatalf("queries %d after A's admission", e.prefixQueries)
	}
	e.add(&seq{prompt: 100, target: 1, maxTokens: 1, hashes: hashes(2), sink: &countSink{}, salt: 2}, now)
	for range 3 {
		e.schedule(now)
		e.complete(now)
	}
	if e.prefixQueries != 100+3*100 {
		t.Fatalf("queries %d: B should count once per step it was tried", e.prefixQueries)
	}
	// A preempted request is not counted when it is tried again.
	before := e.prefixQueries
	s := &seq{prompt: 100, target: 1, maxTokens: 1, hashes: hashes(3), sink: &countSink{}, salt: 3, preempts: 1}
	e.countPrefixQuery(s, 0)
	if e.prefixQueries != before {
		t.Fatal("a resumed request was counted")
	}
}
