package prefixcache

import (
	"testing"

	"github.com/gpurouter/gpurouter/bench/tokens"
	"github.com/gpurouter/gpurouter/kvevents"
)

func stored(hashes []uint64, parent uint64, hasParent bool, toks []uint32) *kvevents.Event {
	return &kvevents.Event{Kind: kvevents.KindBlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: hasParent,
		TokenIDs: toks, BlockSize: 4, Medium: kvevents.SomeString(kvevents.MediumGPU)}
}

func removed(hashes ...uint64) *kvevents.Event {
	return &kvevents.Event{Kind: kvevents.KindBlockRemoved, BlockHashes: hashes}
}

func TestTrackerMapsEngineHashesToKeys(t *testing.T) {
	x := NewIndex()
	s, _ := x.Add("r", 0)
	tr := NewTracker(x, s, 4, 100)
	toks := seqTokens(16, 1)
	keys := AppendKeys(nil, RootSeed, toks, 4)
	held := make([]int, 1)

	// The engine stores the prompt's blocks in two events, chained by the
	// engine's own (arbitrary) hashes.
	tr.Apply(stored([]uint64{901, 902}, 0, false, toks[:8]))
	tr.Apply(stored([]uint64{903, 904}, 902, true, toks[8:]))
	if x.Lookup(keys, held); held[0] != 4 {
		t.Fatalf("holds %d of 4 blocks", held[0])
	}
	// A second copy of block 3 under the same hash: one removal leaves one.
	tr.Apply(stored([]uint64{904}, 903, true, toks[12:]))
	tr.Apply(removed(904))
	if x.Lookup(keys, held); held[0] != 4 {
		t.Fatalf("one copy removed of two: holds %d", held[0])
	}
	tr.Apply(removed(904, 777)) // 777: never seen, ignored
	if x.Lookup(keys, held); held[0] != 3 {
		t.Fatalf("after the last copy went: holds %d", held[0])
	}
	tr.Apply(&kvevents.Event{Kind: kvevents.KindAllBlocksCleared})
	if x.Lookup(keys, held); held[0] != 0 || tr.Blocks() != 0 {
		t.Fatal("AllBlocksCleared left blocks")
	}
}

func TestTrackerNeverClaimsWhatItCannotKey(t *testing.T) {
	toks := seqTokens(12, 2)
	keys := AppendKeys(nil, RootSeed, toks, 4)
	for _, tc := range []struct {
		name  string
		apply func(tr *Tracker)
		want  int
	}{
		{"parent never seen", func(tr *Tracker) {
			tr.Apply(stored([]uint64{2, 3}, 1, true, toks[4:]))
		}, 0},
		{"children of an unknown parent stay unknown", func(tr *Tracker) {
			tr.Apply(stored([]uint64{2}, 1, true, toks[4:8]))
			tr.Apply(stored([]uint64{3}, 2, true, toks[8:]))
			tr.Apply(stored([]uint64{1}, 0, false, toks[:4]))
		}, 1},
		{"extra keys (mm, salt, lora) make a block opaque", func(tr *Tracker) {
			e := stored([]uint64{1, 2, 3}, 0, false, toks)
			e.ExtraKeys, e.ExtraKeysSet = [][]byte{{0xc0}, {0x91, 0xa1, 'x'}, {0xc0}}, true
			tr.Apply(e)
		}, 1},
		{"CPU tier is not the GPU cache", func(tr *Tracker) {
			e := stored([]uint64{1, 2, 3}, 0, false, toks)
			e.Medium = kvevents.SomeString("CPU")
			tr.Apply(e)
		}, 0},
		{"another block size", func(tr *Tracker) {
			e := stored([]uint64{1}, 0, false, toks)
			e.BlockSize = 12
			tr.Apply(e)
		}, 0},
		{"sliding-window group skipped, full-attention kept", func(tr *Tracker) {
			sw := stored([]uint64{11, 12, 13}, 0, false, toks)
			sw.GroupIdx, sw.SpecKind = kvevents.Some(0), kvevents.SomeString("sliding_window")
			tr.Apply(sw)
			fa := stored([]uint64{1, 2}, 0, false, toks[:8])
			fa.GroupIdx, fa.SpecKind = kvevents.Some(1), kvevents.SomeString("full_attention")
			tr.Apply(fa)
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewIndex()
			s, _ := x.Add("r", 0)
			tr := NewTracker(x, s, 4, 100)
			tc.apply(tr)
			held := make([]int, 1)
			if x.Lookup(keys, held); held[0] != tc.want {
				t.Fatalf("holds %d, want %d", held[0], tc.want)
			}
		})
	}
}

func TestTrackerBoundsMemory(t *testing.T) {
	x := NewIndex()
	s, _ := x.Add("r", 0)
	tr := NewTracker(x, s, 4, 10) // at most 2·10+1024 engine blocks
	toks := seqTokens(4, 3)
	for i := range 2000 {
		tr.Apply(stored([]uint64{uint64(i + 1)}, 0, false, toks)) // removals lost
	}
	if tr.Blocks() > 2*10+1024 || tr.Ignored() == 0 {
		t.Fatalf("tracking %d blocks, ignored %d", tr.Blocks(), tr.Ignored())
	}
}

// TestChatRenderingMatchesTheEstimator: CL100KChat's prompt is exactly as
// long as bench/tokens counts a chat request, so the simulator's prompt
// sizes stay what they were.
func TestChatRenderingMatchesTheEstimator(t *testing.T) {
	bpe, err := NewBPE("")
	if err != nil {
		t.Fatal(err)
	}
	est, _ := tokens.New()
	msgs := []Message{{"system", "You are terse."}, {"user", est.Synthesize(300, 1)}, {"assistant", "Sure."}, {"user", "again, please"}}
	ids := CL100KChat().AppendChat(nil, bpe, msgs)
	tm := make([]tokens.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokens.Message{Role: m.Role, Content: m.Content}
	}
	if len(ids) != est.CountChat(tm) {
		t.Fatalf("rendered %d tokens, estimator counts %d", len(ids), est.CountChat(tm))
	}
	if ids[0] != 100264 || ids[len(ids)-1] != 198 {
		t.Fatalf("ids start %d end %d", ids[0], ids[len(ids)-1])
	}
}

// BenchmarkTokenizeAndKeys32k is a request's whole cost before a lookup: a
// 32k-token chat prompt (about 137 KB) tokenized, rendered and hashed into
// 2,000 blocks.
func BenchmarkTokenizeAndKeys32k(b *testing.B) {
	bpe, _ := NewBPE("")
	est, _ := tokens.New()
	msgs := []Message{{"system", "You are a helpful assistant."}, {"user", est.Synthesize(32000, 7)}}
	ct := CL100KChat()
	var ids []uint32
	var keys []uint64
	b.ReportAllocs()
	for b.Loop() {
		ids = ct.AppendChat(ids[:0], bpe, msgs)
		keys = AppendKeys(keys[:0], RootSeed, ids, 16)
	}
	perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perOp/float64(len(ids))*1000, "ns/1k-tokens")
	b.ReportMetric(float64(len(ids)), "tokens")
}

// BenchmarkKeys32k is the hashing alone.
func BenchmarkKeys32k(b *testing.B) {
	ids := seqTokens(32768, 1)
	var keys []uint64
	b.ReportAllocs()
	for b.Loop() {
		keys = AppendKeys(keys[:0], RootSeed, ids, 16)
	}
}
