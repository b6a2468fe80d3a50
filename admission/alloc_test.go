//go:build !race

package admission

import (
	"context"
	"testing"
)

// TestFastPathAllocs pins the fast path's budget: Admit and Release of an
// uncontended request allocate nothing.
func TestFastPathAllocs(t *testing.T) {
	m, _ := NewMetrics(nil)
	c, err := New("m", Config{}, Deps{Capacity: CapacityFunc(func(Cost) bool { return true }), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cost := c.Estimate(1000, 0)
	if n := testing.AllocsPerRun(1000, func() {
		tk, err := c.Admit(ctx, cost)
		if err != nil {
			t.Fatal(err)
		}
		tk.Placed()
		tk.Release()
	}); n != 0 {
		t.Fatalf("Admit+Release allocates %v times, want 0", n)
	}
	u := Usage{PromptTokens: 1200, CompletionTokens: 300}
	if n := testing.AllocsPerRun(1000, func() {
		tk, _ := c.Admit(ctx, c.Estimate(1000, 0))
		tk.ReleaseUsage(u)
	}); n != 0 {
		t.Fatalf("Estimate+Admit+ReleaseUsage allocates %v times, want 0", n)
	}
}
