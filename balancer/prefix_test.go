package balancer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/prefixcache"
)

// prefixPool is a pool of n replicas under policy with a prefix index,
// each replica in the slot of its position, whose fits are learned alike:
// 50 µs a prefill token (20,000 tokens a second), 30 ms a decode step.
func prefixPool(t testing.TB, policy string, n int, approx bool) (*balancer.Pool, []*balancer.Replica, *prefixcache.Index, *fakeClock) {
	t.Helper()
	c := newFakeClock()
	rs := replicas(t, c, n)
	for _, r := range rs {
		for k := range 12 {
			prompt := int64(1000 + 700*k)
			l, _ := r.AcquireRequest(balancer.LeaseCost{PromptTokens: prompt})
			c.advance(time.Duration(prompt) * 50 * time.Microsecond)
			l.PrefillDone()
			l.ObserveDecode(20, 19*30*time.Millisecond)
			l.Done(nil)
		}
	}
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: policy}, rs)
	if err != nil {
		t.Fatal(err)
	}
	idx := prefixcache.NewIndex()
	for i, r := range rs {
		s, err := idx.Add(r.Name(), 1<<16)
		if err != nil {
			t.Fatal(err)
		}
		if s != i {
			t.Fatalf("slot %d for replica %d", s, i)
		}
		r.SetPrefixSlot(s)
	}
	pool.SetPrefixCache(&balancer.PrefixCache{Index: idx, BlockSize: 16, Approximate: approx})
	return pool, rs, idx, c
}

// keys are a prompt of n blocks: the first shared blocks of conversation
// conv, then its own.
func keys(conv, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(conv)<<32 | uint64(i) | 1<<63
	}
	return out
}

// A 16,000-token prompt (1,000 blocks) whose first 15,000 tokens one
// replica holds: there it prefills 1,000 tokens (50 ms), elsewhere 16,000
// (0.8 s). The predictive policy sends it there — until the prefill
// queued there outweighs what the cache saves.
func TestPredictiveGoesWhereThePromptIsCached(t *testing.T) {
	pool, rs, idx, c := prefixPool(t, "predictive", 4, false)
	prompt := keys(7, 1000)
	idx.Store(2, prompt[:window(15000)])
	req := &balancer.Request{Now: c.now(), PromptTokens: 16000, OutputTokens: 200, Prefix: prompt}
	if got := pool.Pick(req); got != rs[2] {
		t.Fatalf("picked %s, want r2 (holds 15,000 of the 16,000 tokens)", got.Name())
	}
	if got := req.CachedTokens(rs[2]); got != window(15000)*16 {
		t.Errorf("CachedTokens(r2) = %d, want %d", got, window(15000)*16)
	}
	if got := req.CachedTokens(rs[0]); got != 0 {
		t.Errorf("CachedTokens(r0) = %d, want 0", got)
	}
	// 2 s of prefill queued on r2 (40,000 tokens): the cache saves 0.75 s
	// there, so another replica is sooner.
	rs[2].AcquireRequest(balancer.LeaseCost{PromptTokens: 40000}) //nolint:errcheck // held: queued prefill
	req = &balancer.Request{Now: c.now(), PromptTokens: 16000, OutputTokens: 200, Prefix: prompt}
	if got := pool.Pick(req); got == rs[2] {
		t.Fatal("cache affinity did not yield to 2 s of prefill queued on the cached replica")
	}
}

// window is the blocks of a 16-token block size in n tokens.
func window(n int) int { return n / 16 }

// prefix_affinity sends a prompt to the replica with its longest cached
// prefix while that replica's load is within the bound, and spreads a hot
// prefix once it is not; a prompt nothing holds goes to the least loaded.
func TestPrefixAffinityFollowsTheLongestMatchWithinTheLoadBound(t *testing.T) {
	pool, rs, idx, c := prefixPool(t, "prefix_affinity", 4, false)
	conv := keys(3, 100)
	idx.Store(1, conv[:40])
	idx.Store(3, conv[:90])
	got := map[string]int{}
	for range 40 {
		req := &balancer.Request{Now: c.now(), PromptTokens: 1600, Prefix: conv}
		r := pool.Pick(req)
		got[r.Name()]++
		r.Acquire() //nolint:errcheck // held: load builds up
	}
	if got["r3"] == 0 || got["r3"] > 15 {
		t.Errorf("r3 (the longest match) took %d of 40 requests: want some, and at most the bound (1.25× the mean of 10)", got["r3"])
	}
	if len(got) < 3 {
		t.Errorf("a hot prefix stayed on %d replicas: %v", len(got), got)
	}
	// Nothing cached anywhere: the least loaded.
	fresh := &balancer.Request{Now: c.now(), PromptTokens: 1600, Prefix: keys(9, 100)}
	r := pool.Pick(fresh)
	for _, o := range rs {
		if o.InFlight() < r.InFlight() {
			t.Fatalf("uncached prompt went to %s (%d in flight), %s has %d", r.Name(), r.InFlight(), o.Name(), o.InFlight())
		}
	}
}

// With an approximate index (no KV events), a placed request's blocks are
// recorded on its replica, so the next turn of the conversation finds
// them there.
func TestApproximateIndexRecordsPlacements(t *testing.T) {
	pool, rs, idx, c := prefixPool(t, "predictive", 4, true)
	turn1 := keys(5, 300)
	req := &balancer.Request{Now: c.now(), PromptTokens: 4800, OutputTokens: 50, Prefix: turn1}
	r := pool.Pick(req)
	l, err := r.AcquireRequest(balancer.LeaseCost{PromptTokens: int64(req.PromptTokens - req.CachedTokens(r)), Prefix: req.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	l.PrefillDone()
	l.Done(nil)
	s, _ := r.PrefixSlot()
	var held [prefixcache.MaxReplicas]int
	if n := idx.Lookup(turn1, held[:]); n != 300 || held[s] != 300 {
		t.Fatalf("after placement on %s: longest match %d, its %d; want 300", r.Name(), n, held[s])
	}
	turn2 := append(append([]uint64{}, turn1...), keys(6, 100)...)
	req = &balancer.Request{Now: c.now(), PromptTokens: 6400, OutputTokens: 50, Prefix: turn2}
	if got := pool.Pick(req); got != r {
		t.Errorf("turn 2 went to %s, turn 1 to %s", got.Name(), r.Name())
	}
	if got := req.CachedTokens(r); got != 4800 {
		t.Errorf("turn 2 cached on %s: %d tokens, want 4800", r.Name(), got)
	}
	_ = rs
}

// BenchmarkPickPrefix is a routing decision with the prefix index: one
// lookup of a 32,000-token prompt (2,000 blocks, 1,500 held by one
// replica) and the policy over it, as a new request makes it. It must not
// allocate.
func BenchmarkPickPrefix(b *testing.B) {
	for _, policy := range []string{"predictive", "prefix_affinity"} {
		for _, n := range []int{4, 16} {
			b.Run(fmt.Sprintf("%s/%d", policy, n), func(b *testing.B) {
				pool, _, idx, c := prefixPool(b, policy, n, false)
				prompt := keys(1, 2000)
				idx.Store(n/2, prompt[:1500])
				idx.Store(0, prompt[:100])
				now := c.now()
				req := &balancer.Request{}
				b.ReportAllocs()
				var picked *balancer.Replica
				for b.Loop() {
					*req = balancer.Request{Now: now, PromptTokens: 32000, OutputTokens: 200, Prefix: prompt}
					picked = pool.Pick(req)
				}
				if picked == nil {
					b.Fatal("no pick")
				}
			})
		}
	}
}

// roomNoLong is a Room with no room on a replica counting a long
// prefill: the stand-in for any of admission's rules saying it is full.
type roomNoLong struct{}

func (roomNoLong) FitsReplica(l balancer.ReplicaLoad, _, _ int, _ time.Duration) bool {
	return l.LongPrefills == 0
}

// A replica holding most of the prompt takes it even when admission's
// room rules say it is full — there it prefills 1,000 of 16,000 tokens,
// elsewhere all of them — but not one holding a sliver of it.
func TestPredictiveTakesTheCacheOverRoom(t *testing.T) {
	pool, rs, idx, c := prefixPool(t, "predictive", 4, false)
	for _, r := range []*balancer.Replica{rs[1], rs[3]} {
		r.AcquireRequest(balancer.LeaseCost{Long: true}) //nolint:errcheck // held: full by the Room's rule
	}
	prompt := keys(9, 1000)
	idx.Store(1, prompt[:window(15000)])
	req := &balancer.Request{Now: c.now(), PromptTokens: 16000, OutputTokens: 200, Prefix: prompt, Room: roomNoLong{}}
	if got := pool.Pick(req); got != rs[1] {
		t.Fatalf("picked %s, want r1 (holds 15,000 of the 16,000 tokens, full only by admission's rules)", got.Name())
	}
	other := keys(10, 1000)
	idx.Store(3, other[:window(2000)])
	req = &balancer.Request{Now: c.now(), PromptTokens: 16000, OutputTokens: 200, Prefix: other, Room: roomNoLong{}}
	if got := pool.Pick(req); got == rs[3] || got == rs[1] {
		t.Fatalf("picked %s, full by admission's rules and holding at most 2,000 of 16,000 tokens", got.Name())
	}
}

// The least prefill time a request can have is on the replica holding
// most of its prompt: admission's TTFT deadline (proxy: steer) subtracts
// it, so a follow-up turn that one replica holds is not judged by the
// prefill of its whole history.
func TestPrefillTimeCounts(t *testing.T) {
	pool, _, idx, c := prefixPool(t, "predictive", 3, false)
	k := keys(1, 1000) // 16,000 tokens
	whole := pool.PrefillTime(16000, c.now())
	if got := pool.PrefillTimeCached(16000, k, c.now()); got != whole {
		t.Fatalf("nothing cached: %v, want the whole prefill %v", got, whole)
	}
	idx.Store(2, k[:900]) // replica 2 holds 14,400 tokens
	got := pool.PrefillTimeCached(16000, k, c.now())
	if want := pool.PrefillTime(1600, c.now()); got != want {
		t.Fatalf("14,400 of 16,000 tokens cached: %v, want the prefill of the 1,600 left (%v; whole %v)", got, want, whole)
	}
	if got >= whole/5 {
		t.Fatalf("cached prefill %v not well under the whole %v", got, whole)
	}
}

// A long generation whose history one replica holds stays there when
// that replica streams a little slower now than the others (45 ms steps
// against 30, well within the 100 ms objective): finishing it there ends
// ~15 s later than elsewhere, past the predictive policy's "late" slack,
// but elsewhere its 15,000 cached tokens would be prefilled again. Before
// the cache counted, "late" sent it away.
func TestPredictiveKeepsAHistoryWhereItIsCachedThoughItDecodesSlower(t *testing.T) {
	pool, rs, idx, c := prefixPool(t, "predictive", 4, false)
	var all []*streams
	for range 40 {
		for i, r := range rs {
			if len(all) < len(rs) {
				all = append(all, newStreams(t, r, c, 3))
			}
			d := 30 * time.Millisecond
			if i == 2 {
				d = 45 * time.Millisecond
			}
			all[i].gap(d)
		}
		c.advance(45 * time.Millisecond)
	}
	defer func() {
		for _, s := range all {
			s.done()
		}
	}()
	prompt := keys(7, 1000)
	idx.Store(2, prompt[:window(15000)])
	req := &balancer.Request{Now: c.now(), PromptTokens: 16000, OutputTokens: 1000, Prefix: prompt,
		SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond}
	if got := pool.Pick(req); got != rs[2] {
		t.Fatalf("picked %s, want r2: it holds 15,000 of the 16,000 tokens and streams within the objective", got.Name())
	}
	// Without the cache the same request is late there and goes elsewhere.
	req = &balancer.Request{Now: c.now(), PromptTokens: 16000, OutputTokens: 1000, Prefix: keys(8, 1000),
		SLOTTFT: 2 * time.Second, SLOTPOT: 100 * time.Millisecond}
	if got := pool.Pick(req); got == rs[2] {
		t.Fatal("an uncached 1,000-token generation went to the replica decoding slowest")
	}
}

// Before any replica of the pool has been measured the least prefill time
// is unknown, and PrefillTime says 0 rather than a guess: admission sheds
// at once what it cannot serve in time, and at the default rate the
// first long prompts of a run were shed that an H100 served in time. A
// replica not yet measured next to measured ones takes their rate.
func TestPrefillTimeIsNotAGuess(t *testing.T) {
	c := newFakeClock()
	rs := replicas(t, c, 2)
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: "predictive"}, rs)
	if err != nil {
		t.Fatal(err)
	}
	if got := pool.PrefillTime(16000, c.now()); got != 0 {
		t.Fatalf("nothing measured: %v, want 0", got)
	}
	for k := range 12 { // r0 prefills at 50 µs a token
		prompt := int64(1000 + 700*k)
		l, _ := rs[0].AcquireRequest(balancer.LeaseCost{PromptTokens: prompt})
		c.advance(time.Duration(prompt) * 50 * time.Microsecond)
		l.PrefillDone()
		l.Done(nil)
	}
	got := pool.PrefillTime(16000, c.now())
	if got < 700*time.Millisecond || got > 900*time.Millisecond {
		t.Fatalf("r0 measured at 50 µs a token: %v for 16,000 tokens, want ~0.8 s on either replica", got)
	}
}

// HeldPrefix is what admission may leave out of a request's prefill: the
// most of its prompt a replica holds, when that is at least half of it
// and the replica is within cache affinity's load bound (else the
// predictive policy sends the request elsewhere, to prefill it whole).
func TestHeldPrefix(t *testing.T) {
	pool, rs, idx, c := prefixPool(t, "predictive", 3, false)
	k := keys(3, 1000) // 16,000 tokens
	if got := pool.HeldPrefix(16000, k, c.now()); got != 0 {
		t.Fatalf("nothing cached: %d", got)
	}
	idx.Store(1, k[:400]) // 6,400 tokens: under half
	if got := pool.HeldPrefix(16000, k, c.now()); got != 0 {
		t.Fatalf("6,400 of 16,000 tokens cached: %d, want 0 (under half the prompt)", got)
	}
	idx.Store(2, k[:900]) // 14,400 tokens
	if got := pool.HeldPrefix(16000, k, c.now()); got != 14400 {
		t.Fatalf("14,400 of 16,000 tokens cached: %d", got)
	}
	for range 8 {
		rs[2].Acquire() //nolint:errcheck // held: 8 in flight where the others have none
	}
	if got := pool.HeldPrefix(16000, k, c.now()); got != 0 {
		t.Fatalf("the holder far over the mean load: %d, want 0 (the request goes elsewhere)", got)
	}
}

// A replica measured at half the pool's prefill speed keeps a history it
// holds only while its load stays near the mean: cache affinity's bound
// scales by what the replica has shown of its speed. Its weight (1, as
// the others') says nothing of it, and counted as a whole replica it could
// run 1.75× the mean in flight for the prompts it holds: 3.5× its share
// of the work.
func TestCacheAffinityBoundShrinksOnASlowReplica(t *testing.T) {
	pool, rs, idx, c := prefixPool(t, "predictive", 4, false)
	k := keys(3, 1000) // 16,000 tokens
	idx.Store(3, k[:900])
	var held []balancer.Lease
	hold := func(r *balancer.Replica, n int) {
		for range n {
			l, err := r.Acquire()
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
	}
	hold(rs[0], 2)
	hold(rs[1], 2)
	hold(rs[2], 2)
	hold(rs[3], 3)
	// All as fast: mean (9+1)/4 = 2.5, bound ⌈1.7·2.5⌉ = 5, and r3 with
	// this request would run 4.
	if got := pool.HeldPrefix(16000, k, c.now()); got != 14400 {
		t.Fatalf("equal speeds: HeldPrefix %d, want 14,400", got)
	}
	for i := range 30 { // r3 now prefills at 100 µs a token, twice the others' time
		prompt := int64(1000 + 700*(i%12))
		l, _ := rs[3].AcquireRequest(balancer.LeaseCost{PromptTokens: prompt})
		c.advance(time.Duration(prompt) * 100 * time.Microsecond)
		l.PrefillDone()
		l.Done(nil)
	}
	if got := pool.HeldPrefix(16000, k, c.now()); got != 0 {
		t.Fatalf("r3 at half speed with 4 in flight where the mean is 2.5: HeldPrefix %d, want 0", got)
	}
	req := &balancer.Request{Now: c.now(), PromptTokens: 16000, OutputTokens: 200, Prefix: k}
	if got := pool.Pick(req); got == rs[3] {
		t.Fatal("picked the half-speed replica over its load bound for its cache")
	}
	held[len(held)-1].Done(nil) // r3 down to 1 in flight, 2 with the request: within ⌈1.7·2·~0.6⌉ = 3
	held[len(held)-2].Done(nil)
	held = held[:len(held)-2]
	if got := pool.HeldPrefix(16000, k, c.now()); got != 14400 {
		t.Fatalf("r3 at half speed, 1 in flight: HeldPrefix %d, want 14,400", got)
	}
	for _, l := range held {
		l.Done(nil)
	}
}

// A request placed away from the replica holding most of its prompt —
// the holder over its load bound, say — counts the hits it gave up on the
// replica it went to, so an operator sees what the bounded load costs in
// prefix-cache hits; one placed where its prompt is cached gives up none.
func TestPlacementCountsForgoneHits(t *testing.T) {
	pool, rs, idx, c := prefixPool(t, "predictive", 3, false)
	prompt := keys(7, 1000)    // 16,000 tokens in 16-token blocks
	idx.Store(1, prompt[:600]) // rs[1] holds 9,600 of them
	idx.Store(2, prompt[:100]) // rs[2] 1,600
	place := func(on *balancer.Replica) {
		t.Helper()
		req := &balancer.Request{Now: c.now(), PromptTokens: 16000, OutputTokens: 50, Prefix: prompt}
		if pool.Pick(req) == nil {
			t.Fatal("no pick")
		}
		cached := req.CachedTokens(on)
		l, err := on.AcquireRequest(balancer.LeaseCost{PromptTokens: int64(16000 - cached), CachedTokens: int64(cached),
			MostCached: int64(req.MostCachedTokens()), Prefix: req.Prefix})
		if err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
	}
	place(rs[2])
	place(rs[1])
	place(rs[0])
	for i, want := range []int64{9600, 0, 8000} {
		st := rs[i].PrefixStats()
		if st == nil || st.ForgoneTokens != want || st.PromptTokens != 16000 {
			t.Errorf("%s: %+v, want forgone %d of 16000 prompt tokens", rs[i].Name(), st, want)
		}
	}
}
