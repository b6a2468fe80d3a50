package admission

import (
	"context"
	"runtime"
	"testing"
)

// BenchmarkAdmitRelease is the uncontended fast path: the queue is empty
// and the pool has room.
func BenchmarkAdmitRelease(b *testing.B) {
	m, _ := NewMetrics(nil)
	capy := CapacityFunc(func(Cost) bool { return true })
	c, err := New("m", Config{}, Deps{Capacity: capy, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	cost := c.Estimate(1000, 256)
	b.ReportAllocs()
	for b.Loop() {
		tk, err := c.Admit(ctx, cost)
		if err != nil {
			b.Fatal(err)
		}
		tk.Release()
	}
}

// BenchmarkAdmitReleaseUsage adds learning from the engine's usage.
func BenchmarkAdmitReleaseUsage(b *testing.B) {
	c, err := New("m", Config{}, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	u := Usage{PromptTokens: 1100, CompletionTokens: 200}
	b.ReportAllocs()
	for b.Loop() {
		tk, err := c.Admit(ctx, c.Estimate(1000, 0))
		if err != nil {
			b.Fatal(err)
		}
		tk.ReleaseUsage(u)
	}
}

// BenchmarkAdmitReleaseParallel is the fast path under contention.
func BenchmarkAdmitReleaseParallel(b *testing.B) {
	c, err := New("m", Config{}, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	cost := Cost{PromptTokens: 1000, OutputTokens: 256}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			tk, err := c.Admit(ctx, cost)
			if err != nil {
				b.Error(err)
				return
			}
			tk.Release()
		}
	})
}

// BenchmarkQueuedAdmit is the slow path: each request queues behind a
// full pool and is admitted by the release before it.
func BenchmarkQueuedAdmit(b *testing.B) {
	c, err := New("m", Config{MaxInFlight: 1}, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	cost := Cost{PromptTokens: 100}
	held, _ := c.Admit(ctx, cost)
	b.ReportAllocs()
	for b.Loop() {
		done := make(chan Ticket)
		go func() {
			tk, _ := c.Admit(ctx, cost)
			done <- tk
		}()
		for c.nQueued.Load() == 0 {
			runtime.Gosched()
		}
		held.Release()
		held = <-done
	}
	held.Release()
}
