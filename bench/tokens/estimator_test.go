package tokens

import (
	"strings"
	"testing"
)

func newEstimator(t testing.TB) *Estimator {
	t.Helper()
	e, err := New()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestCountKnownStrings(t *testing.T) {
	e := newEstimator(t)
	tests := []struct {
		name string
		text string
		want int
	}{
		{"empty", "", 0},
		{"hello world", "Hello, world!", 4},
		{"repeated words", " the the the", 3},
		// cl100k_base reference counts (OpenAI cookbook examples).
		{"sentence", "tiktoken is great!", 6},
		{"antidisestablishmentarianism", "antidisestablishmentarianism", 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := e.Count(tt.text); got != tt.want {
				t.Fatalf("Count(%q) = %d, want %d", tt.text, got, tt.want)
			}
		})
	}
}

func TestCountChatAddsTemplateOverhead(t *testing.T) {
	e := newEstimator(t)
	msgs := []Message{{Role: "system", Content: "You are helpful."}, {Role: "user", Content: "Hello, world!"}}
	content := e.Count("system") + e.Count("You are helpful.") + e.Count("user") + e.Count("Hello, world!")
	want := content + 2*PerMessageOverhead + ReplyPriming
	if got := e.CountChat(msgs); got != want {
		t.Fatalf("CountChat = %d, want %d", got, want)
	}
}

func TestSynthesizeExact(t *testing.T) {
	e := newEstimator(t)
	for _, n := range []int{0, 1, 5, 100, 1000, 4096} {
		for seed := uint64(0); seed < 3; seed++ {
			s := e.Synthesize(n, seed)
			if got := e.Count(s); got != n {
				t.Fatalf("Synthesize(%d, %d) counts %d tokens", n, seed, got)
			}
		}
	}
	if e.Synthesize(50, 1) == e.Synthesize(50, 2) {
		t.Fatal("different seeds gave the same text")
	}
	if e.Synthesize(50, 7) != e.Synthesize(50, 7) {
		t.Fatal("same seed gave different text")
	}
}

func TestAppendBlock(t *testing.T) {
	e := newEstimator(t)
	if len(fillerWords) != 64 {
		t.Fatalf("%d filler words: a block id is spelled in base 64", len(fillerWords))
	}
	full := string(e.AppendBlock(nil, 42, 512))
	if n := e.Count(full); n != 512 {
		t.Fatalf("block of 512 counts %d tokens", n)
	}
	if got := string(e.AppendBlock(nil, 42, 512)); got != full {
		t.Fatal("same id gave different text")
	}
	for _, n := range []int{0, 1, 11, 100, 511} {
		part := string(e.AppendBlock(nil, 42, n))
		if !strings.HasPrefix(full, part) || e.Count(part) != n {
			t.Fatalf("block cut to %d tokens is not the full block's first %d tokens", n, n)
		}
	}
	// Blocks side by side are the sum of their tokens.
	two := e.AppendBlock(e.AppendBlock(nil, 1, 512), 2, 300)
	if n := e.Count(string(two)); n != 812 {
		t.Fatalf("two blocks count %d tokens, want 812", n)
	}
	// Any two ids differ within the first 11 words, so within one KV block.
	seen := map[string]uint64{}
	for id := range uint64(20000) {
		head := string(e.AppendBlock(nil, id, blockIDWords))
		if other, ok := seen[head]; ok {
			t.Fatalf("ids %d and %d start with the same %d words", other, id, blockIDWords)
		}
		seen[head] = id
	}
	for _, id := range []uint64{1 << 63, 1<<64 - 1} {
		if e.Count(string(e.AppendBlock(nil, id, 512))) != 512 {
			t.Fatalf("id %d: not 512 tokens", id)
		}
	}
}

func BenchmarkCount1k(b *testing.B) {
	e := newEstimator(b)
	s := e.Synthesize(1000, 1)
	b.ReportAllocs()
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		e.Count(s)
	}
}
