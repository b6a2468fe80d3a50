package tokens

import "testing"

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

func BenchmarkCount1k(b *testing.B) {
	e := newEstimator(b)
	s := e.Synthesize(1000, 1)
	b.ReportAllocs()
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		e.Count(s)
	}
}
