package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
	"github.com/gpurouter/gpurouter/kvevents"
)

// startKVFleet runs n simulated replicas that publish KV-cache events:
// replica i serves HTTP on base+i, events on base+10+i and replay on
// base+20+i, so one endpoint template ({port+10}) names every replica's.
// The base is an ephemeral port's neighbourhood; a taken one is retried.
func startKVFleet(t *testing.T, n int, engineArgs ...string) *sim.Fleet {
	t.Helper()
	prof, err := sim.Builtin("qwen2.5-7b")
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{"num-gpu-blocks-override": "2048", "max-model-len": "8192"}
	for i := 0; i+1 < len(engineArgs); i += 2 {
		args[engineArgs[i]] = engineArgs[i+1]
	}
	for k, v := range args {
		if err := prof.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	for try := 0; try < 8; try++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if base+30 > 65535 {
			continue
		}
		f, err := sim.NewFleet(sim.FleetConfig{Replicas: n, Profiles: []sim.Profile{prof}, ServedModelNames: []string{"m"},
			Seed: 1, BasePort: base, Speeds: []float64{20},
			KVEvents: &sim.KVEventsConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+10),
				ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+20), Encoding: kvevents.EncodingMap}})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Listen(); err != nil {
			continue // a port of the block was taken: another block
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { f.Run(ctx); close(done) }() //nolint:errcheck
		t.Cleanup(func() { cancel(); <-done })
		return f
	}
	t.Fatal("no free block of ports for the fleet")
	return nil
}

// eventsConfig is a router in front of f with its prefix index fed by
// the replicas' KV events.
func eventsConfig(f *sim.Fleet) fileConfig {
	cfg := fileConfig{
		Log: logConfig{Level: "error"},
		// Scrapes stay fresh however slow the test runs (-race): picks
		// here depend on the index, not on telemetry going stale.
		Telemetry: telemetryConfig{Interval: 50 * time.Millisecond, StaleAfter: 10 * time.Second},
		Pools: []poolConfig{{Model: "m",
			PrefixCache: prefixCacheConfig{Mode: "events"},
			KVEvents:    kvEventsConfig{Endpoint: "tcp://{host}:{port+10}", ReplayEndpoint: "tcp://{host}:{port+20}"}}},
	}
	for i, u := range f.URLs() {
		cfg.Pools[0].Replicas = append(cfg.Pools[0].Replicas, replicaConfig{URL: u, Name: fmt.Sprintf("r%d", i)})
	}
	return cfg
}

// prefixView is /debug/pools' prefix index view of each replica.
type prefixView struct {
	Pools []struct {
		Replicas []struct {
			Name   string `json:"name"`
			Prefix *struct {
				Blocks       int   `json:"blocks"`
				BlockSize    int   `json:"block_size"`
				PromptTokens int64 `json:"prompt_tokens"`
				CachedTokens int64 `json:"predicted_cached_tokens"`
			} `json:"prefix_cache"`
		} `json:"replicas"`
	} `json:"pools"`
}

// indexBlocks is each replica's index size as router reports it.
func indexBlocks(t *testing.T, router string) map[string]int {
	var v prefixView
	getJSON(t, router+"/debug/pools", &v)
	out := map[string]int{}
	for _, r := range v.Pools[0].Replicas {
		if r.Prefix != nil {
			out[r.Name] = r.Prefix.Blocks
		}
	}
	return out
}

// chat sends one chat request through router and returns the replica
// that served it.
func chat(t *testing.T, router, system, user string, maxTokens int) string {
	t.Helper()
	body := fmt.Sprintf(`{"model":"m","max_tokens":%d,"ignore_eos":true,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
		maxTokens, system, user)
	resp, err := http.Post(router+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
	return resp.Header.Get("X-Gpurouter-Replica")
}

// longText is n distinct-ish words: a prompt of about n tokens.
func longText(seed string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s%d ", seed, i%97)
	}
	return b.String()
}

// With events on, the router's index learns from the engines what they
// cached, and the keys a request gets from the router's own tokenizer and
// chat rendering match them: a repeated prompt is predicted cached,
// nearly whole, on the replica that served it, and goes there again.
func TestPrefixEventsRouting(t *testing.T) {
	f := startKVFleet(t, 3)
	router := startConfiguredRouter(t, eventsConfig(f))
	system := longText("sys", 800)

	first := chat(t, router, system, "hello there", 2)
	waitUntil(t, 10*time.Second, "the index to hold the first prompt", func() bool { return indexBlocks(t, router)[first] >= 800/16 })
	for i := range 5 {
		if got := chat(t, router, system, fmt.Sprintf("question %d", i), 2); got != first {
			t.Fatalf("request %d with the cached system prompt went to %s, the cache is on %s", i, got, first)
		}
	}
	var v prefixView
	getJSON(t, router+"/debug/pools", &v)
	for _, r := range v.Pools[0].Replicas {
		if r.Name != first {
			continue
		}
		// Every request after the first found the system prompt cached.
		if p := r.Prefix; p == nil || p.CachedTokens < 5*800*9/10 {
			t.Fatalf("replica %s: predicted cached %+v, want most of 5 × ~800 tokens", first, p)
		}
	}
}

// Cache affinity yields to load: many long requests sharing one cached
// prefix at once spread over the fleet instead of piling onto the replica
// that holds it. The holder may run up to 1.75× the mean in flight
// (balancer: cachedWithin), so of 30 requests arriving together on three
// replicas it takes about 58% until the others hold the prefix too; never
// the 90% of an unbounded affinity.
func TestPrefixEventsLoadBound(t *testing.T) {
	f := startKVFleet(t, 3)
	router := startConfiguredRouter(t, eventsConfig(f))
	system := longText("shared", 600)
	first := chat(t, router, system, "warm up", 2)
	waitUntil(t, 10*time.Second, "the index to hold the prefix", func() bool { return indexBlocks(t, router)[first] >= 600/16 })

	const n = 30
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := chat(t, router, system, fmt.Sprintf("user %d", i), 400)
			mu.Lock()
			counts[r]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("requests per replica: %v (the prefix is on %s)", counts, first)
	for r, c := range counts {
		if c > n*7/10 {
			t.Fatalf("replica %s took %d of %d requests: a hot spot (%v)", r, c, n, counts)
		}
	}
}

// Four routers on one fleet read the same events: their indexes agree,
// and so do their picks for the same request.
func TestPrefixEventsFourRoutersAgree(t *testing.T) {
	f := startKVFleet(t, 3)
	var routers []string
	for range 4 {
		routers = append(routers, startConfiguredRouter(t, eventsConfig(f)))
	}
	// Three prompts, each through another router, on whichever replica.
	for i := range 3 {
		chat(t, routers[i], longText(fmt.Sprintf("doc%d-", i), 500), "summarise", 2)
	}
	waitUntil(t, 10*time.Second, "the four indexes to agree", func() bool {
		want := indexBlocks(t, routers[0])
		total := 0
		for _, b := range want {
			total += b
		}
		if total < 3*500/16 {
			return false
		}
		for _, r := range routers[1:] {
			if fmt.Sprint(indexBlocks(t, r)) != fmt.Sprint(want) {
				return false
			}
		}
		return true
	})
	for i := range 3 {
		doc := longText(fmt.Sprintf("doc%d-", i), 500)
		var picks []string
		for _, r := range routers {
			picks = append(picks, chat(t, r, doc, "again", 2))
		}
		for _, p := range picks[1:] {
			if p != picks[0] {
				t.Fatalf("document %d: the routers picked %v", i, picks)
			}
		}
	}
}

// With no prefix configuration at all, the router's index is approximate
// (fed by its own placements): a repeated system prompt goes back to the
// replica it went to first.
func TestPrefixApproximateByDefault(t *testing.T) {
	f := startSimFleet(t, 3, nil)
	cfg := fileConfig{Log: logConfig{Level: "error"}, Pools: []poolConfig{{Model: "m"}}}
	for i, u := range f.URLs() {
		cfg.Pools[0].Replicas = append(cfg.Pools[0].Replicas, replicaConfig{URL: u, Name: fmt.Sprintf("r%d", i)})
	}
	router := startConfiguredRouter(t, cfg)
	system := longText("sys", 400)
	first := chat(t, router, system, "hello", 2)
	for i := range 5 {
		if got := chat(t, router, system, fmt.Sprintf("question %d", i), 2); got != first {
			t.Fatalf("request %d went to %s, its prefix to %s", i, got, first)
		}
	}
	if b := indexBlocks(t, router); b[first] == 0 {
		t.Fatalf("index sizes %v: nothing recorded on %s", b, first)
	}
}

// The router's keys for a prompt are the engine's blocks: what the index
// predicts a repeated completion prompt has cached is exactly what the
// engine then reports it served from cache (vllm:prefix_cache_hits_total).
func TestPrefixEventsKeysMatchTheEngine(t *testing.T) {
	t.Run("block size 16", func(t *testing.T) { keysMatchTheEngine(t, 16) })
	// The file names no block size: the router cuts prompts in the one
	// the engines report (vllm:cache_config_info), not in vLLM's default.
	t.Run("block size 32, learned", func(t *testing.T) { keysMatchTheEngine(t, 32) })
}

func keysMatchTheEngine(t *testing.T, blockSize int) {
	f := startKVFleet(t, 2, "block-size", fmt.Sprint(blockSize))
	router := startConfiguredRouter(t, eventsConfig(f))
	waitUntil(t, 10*time.Second, "the engines' block size", func() bool {
		var v prefixView
		getJSON(t, router+"/debug/pools", &v)
		for _, r := range v.Pools[0].Replicas {
			if r.Prefix == nil || r.Prefix.BlockSize != blockSize {
				return false
			}
		}
		return true
	})
	prompt := longText("doc", 700)
	send := func() string {
		body := fmt.Sprintf(`{"model":"m","max_tokens":2,"ignore_eos":true,"prompt":%q}`, prompt)
		resp, err := http.Post(router+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp.Header.Get("X-Gpurouter-Replica")
	}
	first := send()
	waitUntil(t, 10*time.Second, "the index to hold the prompt", func() bool { return indexBlocks(t, router)[first] > 0 })
	if again := send(); again != first {
		t.Fatalf("the repeated prompt went to %s, its blocks are on %s", again, first)
	}
	var v prefixView
	getJSON(t, router+"/debug/pools", &v)
	var predicted int64
	for _, r := range v.Pools[0].Replicas {
		if r.Name == first && r.Prefix != nil {
			predicted = r.Prefix.CachedTokens
		}
	}
	i := int(first[1] - '0')
	hits := engineCounter(t, f.URLs()[i], "vllm:prefix_cache_hits_total")
	if predicted == 0 || float64(predicted) != hits {
		t.Fatalf("the index predicted %d cached tokens on %s, the engine served %v from cache", predicted, first, hits)
	}
}

// engineCounter sums a counter's series on an engine's /metrics.
func engineCounter(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			var v float64
			fmt.Sscan(rest[strings.LastIndexByte(rest, ' ')+1:], &v)
			sum += v
		}
	}
	return sum
}
