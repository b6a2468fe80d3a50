package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

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
