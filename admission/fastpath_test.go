package admission

import (
	"context"
	"testing"
)

// TestTryAdmitIsAdmitsFastPath: TryAdmit admits exactly when Admit would
// without waiting — room and an empty queue — and counts the same.
func TestTryAdmitIsAdmitsFastPath(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{MaxOutstandingTokens: 100}, Deps{})
	tk, ok := h.c.TryAdmit(tok(60, 0))
	if !ok || !tk.Admitted() {
		t.Fatal("an empty pool refused the fast path")
	}
	if s := h.c.Stats(); s.InFlight != 1 || s.OutstandingTokens != 60 {
		t.Fatalf("stats %+v", s)
	}
	if _, ok := h.c.TryAdmit(tok(50, 0)); ok {
		t.Fatal("60+50 > 100 admitted on the fast path")
	}
	// Something queued: no overtaking it on the fast path, even when the
	// request would fit.
	h.add("queued", tok(50, 0))
	if _, ok := h.c.TryAdmit(tok(1, 0)); ok {
		t.Fatal("the fast path overtook a queued request")
	}
	tk.Release()
	if got := h.nextAdmitted(); got != "queued" {
		t.Fatalf("admitted %s", got)
	}
	if s := h.c.Stats(); s.InFlight != 1 || s.OutstandingTokens != 50 {
		t.Fatalf("after release: stats %+v", s)
	}
	tk2, err := h.c.Admit(context.Background(), tok(10, 0))
	if err != nil || !tk2.Admitted() {
		t.Fatalf("Admit after: %v", err)
	}
	tk2.Release()
}

// BenchmarkTryAdmit is the admission cost of a request to a pool with
// room: a lock, the fit check, the ticket (0 allocs).
func BenchmarkTryAdmit(b *testing.B) {
	c, err := New("m", Config{}, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		tk, ok := c.TryAdmit(tok(100, 10))
		if !ok {
			b.Fatal("refused")
		}
		tk.Release()
	}
}
