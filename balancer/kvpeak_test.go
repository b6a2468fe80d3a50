package balancer

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// bruteKVPeak is the model's peak step by step: at step t every entry
// still alive (t < left) holds held + grow·t.
func bruteKVPeak(es []kvEntry, horizon int64) int64 {
	var best int64
	for t := int64(0); t <= horizon; t++ {
		var u int64
		for _, e := range es {
			if t < e.left {
				u += e.held + e.grow*t
			}
		}
		best = max(best, u)
	}
	return best
}

// TestKVPeakIsTheModelsFullestStep: compute finds the fullest step of the
// model, for random mixes of decoding requests and requests counted
// whole until they end.
func TestKVPeakIsTheModelsFullestStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		var k kvLedger
		var es []kvEntry
		for range rng.IntN(12) {
			st := &leaseState{kv: 0}
			prompt, output := int64(1+rng.IntN(2000)), int64(rng.IntN(500))
			st.kv, st.output = prompt+output, output
			switch rng.IntN(4) {
			case 0: // before its first token
			case 1: // past its expected output
				st.made.Store(output + int64(rng.IntN(50)))
			default:
				if output > 0 {
					st.made.Store(1 + rng.Int64N(output))
				}
			}
			k.add(st)
			es = append(es, st.kvEntry())
		}
		if got, want := k.compute(), bruteKVPeak(es, 600); got != want {
			t.Fatalf("trial %d: %+v: peak %d, step by step %d", trial, es, got, want)
		}
	}
}

// TestKVPeakOfRequestsMidDecode: three 1,000-token prompts asking for
// 400 tokens, 100, 200 and 300 made, reserve 4,200 tokens but will hold
// at most 3,897 at once: the step before the furthest along ends. A
// request before its first token counts whole; one that ends is gone at
// the next read.
func TestKVPeakOfRequestsMidDecode(t *testing.T) {
	var k kvLedger
	var sts []*leaseState
	for _, made := range []int64{100, 200, 300} {
		st := &leaseState{kv: 1400, output: 400}
		st.made.Store(made)
		k.add(st)
		sts = append(sts, st)
	}
	now := time.Unix(100, 0)
	if got := k.peak(now); got != 3897 {
		t.Fatalf("peak %d, want 3897 (1300+99 + 1200+99 + 1100+99)", got)
	}
	fresh := &leaseState{kv: 1400, output: 400}
	k.add(fresh)
	if got := k.peak(now); got != 3897+1400 {
		t.Errorf("a request placed: peak %d, want the last one plus its whole footprint, %d", got, 3897+1400)
	}
	now = now.Add(kvRefresh)
	if got := k.peak(now); got != 3897+1400 {
		t.Errorf("before its first token it counts whole: peak %d, want %d", got, 3897+1400)
	}
	k.remove(sts[2])
	if got := k.peak(now); got != 1100+199+1200+199+1400 {
		t.Errorf("the furthest along ended: peak %d, want %d", got, 1100+199+1200+199+1400)
	}
	for _, st := range []*leaseState{sts[0], sts[1], fresh} {
		k.remove(st)
	}
	if got := k.peak(now); got != 0 || len(k.live) != 0 {
		t.Errorf("all ended: peak %d, %d live", got, len(k.live))
	}
}

// TestKVPeakNeverGrowsUnbounded: requests of unknown output or past it
// count at what they hold, for ever, without overflow.
func TestKVPeakNeverGrowsUnbounded(t *testing.T) {
	var k kvLedger
	unknown := &leaseState{kv: 500}
	unknown.made.Store(30)
	over := &leaseState{kv: 600, output: 100}
	over.made.Store(140)
	growing := &leaseState{kv: 300, output: 200}
	growing.made.Store(50)
	for _, st := range []*leaseState{unknown, over, growing} {
		k.add(st)
	}
	want := int64(530 + 640 + 150 + 149) // unknown: its prompt and what it made; over: the same; growing: 150 held, 149 steps to go
	if got := k.compute(); got != want || got < 0 || got == math.MaxInt64 {
		t.Errorf("peak %d, want %d", got, want)
	}
}

// BenchmarkKVPeak is one computation over 32 requests in flight, as a
// replica's first read after a request ended pays it.
func BenchmarkKVPeak(b *testing.B) {
	var k kvLedger
	for i := range 32 {
		st := &leaseState{kv: 1500, output: 400}
		st.made.Store(int64(1 + i*12))
		k.add(st)
	}
	b.ReportAllocs()
	for b.Loop() {
		k.compute()
	}
}
