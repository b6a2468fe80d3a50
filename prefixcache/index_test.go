package prefixcache

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func seqTokens(n int, salt uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(i)*2654435761 ^ salt
	}
	return t
}

func TestAppendKeysChainsBlocks(t *testing.T) {
	a := seqTokens(64, 1)
	b := append(slices.Clone(a[:32]), seqTokens(32, 2)...)
	ka := AppendKeys(nil, RootSeed, a, 16)
	kb := AppendKeys(nil, RootSeed, b, 16)
	if len(ka) != 4 || !slices.Equal(ka[:2], kb[:2]) || ka[2] == kb[2] || ka[3] == kb[3] {
		t.Fatalf("shared prefix must share exactly its blocks: %x %x", ka, kb)
	}
	if got := AppendKeys(nil, RootSeed, a[:47], 16); !slices.Equal(got, ka[:2]) {
		t.Fatal("a partial last block has no key")
	}
	if got := AppendKeys(nil, NamespaceSeed("lora-a"), a, 16); got[0] == ka[0] {
		t.Fatal("a namespace changes every key")
	}
	// Blocks larger than the stack chunk hash the same way whatever the
	// chunking: compare a 512-token block with its streaming digest.
	big := seqTokens(1024, 3)
	k := AppendKeys(nil, RootSeed, big, 512)
	if len(k) != 2 || k[0] == k[1] {
		t.Fatalf("keys %x", k)
	}
	if allocs := testing.AllocsPerRun(10, func() { k = AppendKeys(k[:0], RootSeed, big, 512) }); allocs > 0 {
		t.Fatalf("%v allocs hashing large blocks", allocs)
	}
}

func TestIndexLookup(t *testing.T) {
	x := NewIndex()
	r0, _ := x.Add("r0", 0)
	r1, _ := x.Add("r1", 0)
	r2, _ := x.Add("r2", 0)
	keys := AppendKeys(nil, RootSeed, seqTokens(16*10, 9), 16)
	x.Store(r0, keys[:3])
	x.Store(r1, keys)
	x.Store(r2, keys[1:]) // not the first block: no prefix
	held := make([]int, MaxReplicas)
	if best := x.Lookup(keys, held); best != 10 {
		t.Fatalf("best %d", best)
	}
	if held[r0] != 3 || held[r1] != 10 || held[r2] != 0 || held[3] != 0 {
		t.Fatalf("held %v", held[:4])
	}
	x.Evict(r1, keys[5:6])
	if x.Lookup(keys, held); held[r1] != 5 {
		t.Fatalf("after evicting block 5, r1 holds %d", held[r1])
	}
	x.Clear(r0)
	if x.Lookup(keys, held); held[r0] != 0 || x.Len(r0) != 0 {
		t.Fatal("clear left blocks")
	}
	// A short held slice is fine: slots past it are not reported.
	short := make([]int, 1)
	if best := x.Lookup(keys, short); best != 5 {
		t.Fatalf("best %d", best)
	}
}

func TestIndexCapacityIsLRU(t *testing.T) {
	x := NewIndex()
	s, _ := x.Add("r", 4)
	keys := AppendKeys(nil, RootSeed, seqTokens(16*6, 1), 16)
	x.Store(s, keys[:4])
	x.Store(s, keys[:1]) // touch block 0: block 1 is now the oldest
	x.Store(s, keys[4:5])
	held := make([]int, 1)
	x.Lookup(keys, held)
	if x.Len(s) != 4 || held[0] != 1 {
		t.Fatalf("len %d, leading %d: the oldest (block 1) should have gone", x.Len(s), held[0])
	}
	x.SetCapacity(s, 2)
	if x.Len(s) != 2 {
		t.Fatalf("len %d after shrinking", x.Len(s))
	}
	x.EvictOldest(s, 1)
	if x.Len(s) != 1 {
		t.Fatalf("len %d", x.Len(s))
	}
}

func TestIndexSlots(t *testing.T) {
	x := NewIndex()
	for i := range MaxReplicas {
		if _, err := x.Add(fmt.Sprint(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := x.Add("one too many", 0); !errors.Is(err, ErrFull) {
		t.Fatalf("err %v", err)
	}
	keys := AppendKeys(nil, RootSeed, seqTokens(32, 1), 16)
	x.Store(7, keys)
	x.Remove(7)
	x.Store(7, keys) // a late store for the removed replica is dropped
	s, _ := x.Add("new", 0)
	held := make([]int, MaxReplicas)
	if x.Lookup(keys, held); s != 7 || held[7] != 0 {
		t.Fatalf("slot %d inherited %d blocks", s, held[7])
	}
	if x.Name(7) != "new" || len(x.Slots()) != MaxReplicas {
		t.Fatal("slot bookkeeping")
	}
}

func TestLookupAllocatesNothing(t *testing.T) {
	x, keys := benchIndex(8, 2048)
	held := make([]int, MaxReplicas)
	if allocs := testing.AllocsPerRun(100, func() { x.Lookup(keys, held) }); allocs != 0 {
		t.Fatalf("%v allocs per lookup", allocs)
	}
}

// benchIndex has n replicas; replica i holds the first (i+1)/n of the
// prompt's blocks.
func benchIndex(n, blocks int) (*Index, []uint64) {
	x := NewIndex()
	keys := AppendKeys(nil, RootSeed, seqTokens(16*blocks, 5), 16)
	for i := range n {
		s, _ := x.Add(fmt.Sprint(i), 0)
		x.Store(s, keys[:blocks*(i+1)/n])
		x.Store(s, AppendKeys(nil, uint64(i+1), seqTokens(16*blocks, uint32(i)), 16)) // other traffic
	}
	return x, keys
}

// BenchmarkLookup: a 32k-token prompt (2,048 blocks of 16) against 8
// replicas holding 16k–32k blocks each.
func BenchmarkLookup(b *testing.B) {
	x, keys := benchIndex(8, 2048)
	held := make([]int, MaxReplicas)
	b.ReportAllocs()
	for b.Loop() {
		x.Lookup(keys, held)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(keys)), "ns/block")
}

func BenchmarkLookupParallel(b *testing.B) {
	x, keys := benchIndex(8, 2048)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		held := make([]int, MaxReplicas)
		for pb.Next() {
			x.Lookup(keys, held)
		}
	})
}

// BenchmarkStore: one BlockStored's worth of blocks (16) into a replica at
// its capacity, so every store also evicts.
func BenchmarkStore(b *testing.B) {
	x := NewIndex()
	s, _ := x.Add("r", 100_000)
	keys := AppendKeys(nil, RootSeed, seqTokens(16*200_000, 5), 16)
	x.Store(s, keys[:100_000])
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		j := 100_000 + (i*16)%100_000
		x.Store(s, keys[j:j+16])
		i++
	}
}

// Age's stand-ins take the places of blocks the index cannot name: past
// the slot's capacity the least recent real blocks go, stand-ins are
// never found and not counted, and they age out in turn.
func TestIndexAgeEvictsLeastRecent(t *testing.T) {
	x := NewIndex()
	s, err := x.Add("r", 10)
	if err != nil {
		t.Fatal(err)
	}
	keys := []uint64{11, 12, 13, 14, 15, 16}
	x.Store(s, keys)
	x.Age(s, 3) // 9 of 10 places: nothing goes yet
	held := make([]int, 1)
	if got := x.Lookup(keys, held); got != 6 || x.Len(s) != 6 {
		t.Fatalf("before capacity: match %d, len %d; want 6, 6", got, x.Len(s))
	}
	x.Age(s, 3) // 12 places: the 2 least recent real blocks go
	if got := x.Lookup(keys[2:], held); got != 4 || x.Len(s) != 4 {
		t.Fatalf("after 2 over capacity: match of the newest 4 %d, len %d; want 4, 4", got, x.Len(s))
	}
	if got := x.Lookup(keys, held); got != 0 {
		t.Fatalf("the evicted first block still matches (%d)", got)
	}
	x.Store(s, []uint64{21, 22, 23, 24, 25, 26}) // the older real blocks go first, then stand-ins
	if x.Len(s) != 6 || x.Lookup(keys[2:], held) != 0 {
		t.Fatalf("len %d after 6 more real blocks, want 6 (4 stand-ins left, newer than the 4 older blocks)", x.Len(s))
	}
	x.Store(s, []uint64{31, 32, 33, 34}) // the stand-ins age out in turn
	if x.Len(s) != 10 {
		t.Fatalf("len %d after 4 more, want the capacity (10): the stand-ins aged out", x.Len(s))
	}
	x.Age(s, 1000) // more than the capacity: everything goes, bounded work
	if x.Len(s) != 0 || x.Lookup([]uint64{26}, held) != 0 {
		t.Fatalf("after aging past the capacity: len %d", x.Len(s))
	}
	x.Clear(s)
	x.Store(s, keys)
	if x.Len(s) != 6 {
		t.Fatalf("after Clear and a store: len %d, want 6", x.Len(s))
	}
	u, _ := x.Add("unbounded", 0)
	x.Store(u, keys)
	x.Age(u, 100)
	if x.Len(u) != 6 {
		t.Fatalf("a slot without capacity aged: len %d", x.Len(u))
	}
}
