package prefixcache

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpurouter/gpurouter/bench/tokens"
)

// countingTokenizer counts the texts it tokenizes.
type countingTokenizer struct {
	Tokenizer
	calls atomic.Int64
}

func (c *countingTokenizer) AppendTokens(dst []uint32, text string) []uint32 {
	c.calls.Add(1)
	return c.Tokenizer.AppendTokens(dst, text)
}

// A Memo returns exactly what its tokenizer returns, tokenizing a long
// text once however often it comes, and short texts every time; it never
// holds more than its bound, forgetting the least recently used first.
func TestMemoIsItsTokenizer(t *testing.T) {
	bpe, err := NewBPE("")
	if err != nil {
		t.Fatal(err)
	}
	ct := &countingTokenizer{Tokenizer: bpe}
	m := NewMemo(ct, 64, 2000)
	est, _ := tokens.New()
	texts := []string{"short", strings.Repeat("héllo wörld 你好 ", 40), est.Synthesize(300, 1), est.Synthesize(300, 2), est.Synthesize(300, 3)}
	for round := range 3 {
		for i, s := range texts {
			got := m.AppendTokens([]uint32{7}, s)
			want := bpe.AppendTokens([]uint32{7}, s)
			if !slices.Equal(got, want) {
				t.Fatalf("round %d text %d: ids differ from the tokenizer's", round, i)
			}
		}
	}
	// "short" each round; each long text once.
	if n := ct.calls.Load(); n != 3+4 {
		t.Fatalf("%d tokenizations; want 7", n)
	}
	if _, n := m.Len(); n > 2000 {
		t.Fatalf("the memo holds %d tokens, over its bound of 2000", n)
	}
	// Over the bound: the least recently used goes first.
	m = NewMemo(ct, 64, 1000)
	a, b, c := est.Synthesize(300, 4), est.Synthesize(300, 5), est.Synthesize(300, 6)
	for _, s := range []string{a, b, c, a, est.Synthesize(300, 7)} {
		m.AppendTokens(nil, s)
	}
	before := ct.calls.Load()
	m.AppendTokens(nil, a) // kept: used just now
	m.AppendTokens(nil, b) // forgotten: the least recently used
	if n := ct.calls.Load() - before; n != 1 {
		t.Fatalf("%d tokenizations after eviction; want 1 (b only)", n)
	}
}

// Goroutines sharing a Memo each get the tokenizer's ids (under -race:
// no data race on the entries they copy).
func TestMemoConcurrent(t *testing.T) {
	bpe, _ := NewBPE("")
	m := NewMemo(bpe, 16, 4000)
	var texts []string
	var want [][]uint32
	for i := range 12 {
		s := fmt.Sprintf("conversation %d: %s", i, strings.Repeat("the same history again, ", 20+i))
		texts = append(texts, s)
		want = append(want, bpe.AppendTokens(nil, s))
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				k := (i*7 + g) % len(texts)
				if got := m.AppendTokens(nil, texts[k]); !slices.Equal(got, want[k]) {
					t.Errorf("goroutine %d: text %d differs", g, k)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkTokenizeAndKeys32kMemo is BenchmarkTokenizeAndKeys32k for the
// next turn of a conversation: its 32k-token history remembered, a new
// 200-token question tokenized.
func BenchmarkTokenizeAndKeys32kMemo(b *testing.B) {
	bpe, _ := NewBPE("")
	m := NewMemo(bpe, 0, 0)
	est, _ := tokens.New()
	history := est.Synthesize(32000, 7)
	ct := CL100KChat()
	msgs := []Message{{"system", "You are a helpful assistant."}, {"user", history}, {"user", ""}}
	var ids []uint32
	var keys []uint64
	m.AppendTokens(nil, history)
	turn := 0
	b.ReportAllocs()
	for b.Loop() {
		turn++
		msgs[2].Content = fmt.Sprintf("question %d: %s", turn, est.Synthesize(200, uint64(turn%64)))
		ids = ct.AppendChat(ids[:0], m, msgs)
		keys = AppendKeys(keys[:0], RootSeed, ids, 16)
	}
	perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perOp/float64(len(ids))*1000, "ns/1k-tokens")
	b.ReportMetric(float64(len(ids)), "tokens")
}
