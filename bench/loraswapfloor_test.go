package bench

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func adapterRecords(models ...string) []Record {
	recs := make([]Record, len(models))
	for i, m := range models {
		recs[i] = Record{Model: m, Scheduled: time.Duration(i) * time.Millisecond}
	}
	return recs
}

// Belady's choice by hand: with 2 slots and a b c a b, c evicts b (asked
// for again after a), so a hits and b misses once more: 2 misses; LRU
// would miss on every request after the first two.
func TestBeladyMissesByHand(t *testing.T) {
	for _, tc := range []struct {
		seq   string
		slots int
		want  int
	}{
		{"a b c a b", 2, 2},
		{"a b c a b", 3, 0},
		{"a a a a", 1, 0},
		{"a b a b a b", 1, 5},
		{"a b c d a b c d", 3, 2},
		{"a b", 0, 2},
		{"", 4, 0},
	} {
		if got := beladyMisses(strings.Fields(tc.seq), tc.slots); got != tc.want {
			t.Errorf("%q over %d slots: %d misses, want %d", tc.seq, tc.slots, got, tc.want)
		}
	}
}

// The floor takes the requests in the order they were scheduled, not the
// order of the records (a run's records are in completion order too).
func TestSwapFloorOrdersBySchedule(t *testing.T) {
	recs := adapterRecords("a", "b", "c", "a", "b")
	recs[3].Scheduled, recs[4].Scheduled = -2*time.Millisecond, -time.Millisecond // a b first: a b a b c
	recs = append(recs, Record{Scheduled: time.Second})                           // no adapter: left out
	f := LoRASwapFloor(recs, 2, nil)
	if f.Requests != 5 || f.Offline != 1 || !math.IsNaN(f.Online) {
		t.Fatalf("floor %+v, want 5 requests, 1 offline miss (c), no online floor", f)
	}
	if got := f.PerKilo(float64(f.Offline)); got != 200 {
		t.Fatalf("per 1,000: %v, want 200", got)
	}
}

// The online floor is the share of the requests outside the slots most
// popular adapters; no replacement rule that can't see the next request
// does better on independent draws, and Belady, which can, does better
// still. Checked against LRU over a long Zipf(1) sequence of 32 adapters
// and 16 slots: Belady < expected floor < LRU.
func TestSwapFloorZipf(t *testing.T) {
	names := make([]string, 32)
	for i := range names {
		names[i] = string(rune('A' + i))
	}
	mix := AdapterMix{Names: names, Zipf: 1}
	reqs := make([]Request, 20000)
	mix.Assign(reqs, 7)
	recs := make([]Record, len(reqs))
	for i := range recs {
		recs[i] = Record{Model: reqs[i].Model, Scheduled: time.Duration(i)}
	}
	f := LoRASwapFloor(recs, 16, mix.Shares())
	h := func(n int) float64 {
		s := 0.0
		for k := 1; k <= n; k++ {
			s += 1 / float64(k)
		}
		return s
	}
	if want := 20000 * (1 - h(16)/h(32)); math.Abs(f.Online-want) > 1e-6 {
		t.Fatalf("online floor %v, want %v (1 - H16/H32 of the requests)", f.Online, want)
	}
	lru := lruMisses(recs, 16)
	if !(float64(f.Offline) < f.Online && f.Online < float64(lru)) {
		t.Fatalf("Belady %d, online floor %.0f, LRU %d: want them in that order", f.Offline, f.Online, lru)
	}
	// And random placement over 4 replicas of 4 slots each, as HAProxy
	// spreads them, misses far more than either.
	if r := randomPlacementMisses(recs, 4, 4); r <= lru {
		t.Fatalf("random over 4x4 slots %d misses, LRU over 16 %d: want more", r, lru)
	}
}

func lruMisses(recs []Record, slots int) int {
	var cache []string
	misses := 0
	for _, r := range recs {
		hit := -1
		for i, a := range cache {
			if a == r.Model {
				hit = i
			}
		}
		if hit >= 0 {
			cache = append(cache[:hit], cache[hit+1:]...)
		} else if len(cache) >= slots {
			cache = cache[1:]
			misses++
		}
		cache = append(cache, r.Model)
	}
	return misses
}

func randomPlacementMisses(recs []Record, replicas, slots int) int {
	rng := rand.New(rand.NewPCG(1, 2))
	parts := make([][]Record, replicas)
	for _, r := range recs {
		k := rng.IntN(replicas)
		parts[k] = append(parts[k], r)
	}
	n := 0
	for _, p := range parts {
		n += lruMisses(p, slots)
	}
	return n
}

func TestMaxLoRAsReadsTheNewestSeries(t *testing.T) {
	snap, err := ParseMetrics(strings.NewReader(`# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.8e9
vllm:lora_requests_info{max_lora="8",running_lora_adapters="x",waiting_lora_adapters=""} NaN
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.maxLoRAs(); got != 4 {
		t.Fatalf("max_lora %d, want 4 (the newest series)", got)
	}
	if got := (Snapshot{}).maxLoRAs(); got != 0 {
		t.Fatalf("no LoRA metric: %d, want 0", got)
	}
}
