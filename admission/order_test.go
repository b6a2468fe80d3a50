package admission

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// serial is a pool that takes one request at a time, so every release
// admits exactly one queued request and the order is observable.
func serial(cfg Config) Config {
	cfg.MaxInFlight = 1
	return cfg
}

func TestShortestFirst(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{}), Deps{})
	h.admitNow("hold", tok(10, 0))
	h.add("a", tok(300, 0))
	h.add("b", tok(100, 0))
	h.add("c", tok(200, 0))
	h.add("d", tok(100, 0)) // ties with b: arrival order breaks it
	if got, want := h.serialOrder("hold", 4), []string{"b", "d", "c", "a"}; !slices.Equal(got, want) {
		t.Fatalf("admission order %v, want %v", got, want)
	}
}

func TestAgingBoundsWaitUnderShortStream(t *testing.T) {
	t.Parallel()
	const bound = 10 * time.Second
	h := newHarness(t, serial(Config{AgingBound: bound}), Deps{})
	h.admitNow("s0", tok(10, 0))
	h.add("long", tok(5000, 0))
	// Adversarial: a new short request arrives every second, just before
	// the pool frees a slot, so shortest-first alone would never pick long.
	holder := "s0"
	for i := 1; ; i++ {
		h.clock.Advance(time.Second)
		h.add(fmt.Sprintf("s%d", i), tok(10, 0))
		h.release(holder)
		holder = h.nextAdmitted()
		if holder == "long" {
			if i != 10 {
				t.Fatalf("long admitted after %ds, want at the first release once aged (10s)", i)
			}
			if w := h.tickets["long"].Waited(); w != bound {
				t.Fatalf("long waited %v, want %v", w, bound)
			}
			break
		}
		if i > 10 {
			t.Fatalf("long still waiting after %ds (bound %v); admitted %s", i, bound, holder)
		}
	}
	// Shortest-first resumes: the short that arrived last goes next.
	h.release("long")
	if got := h.nextAdmitted(); got != "s10" {
		t.Fatalf("after long: admitted %s, want s10", got)
	}
}

func TestNegativeAgingBoundIsFCFS(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{AgingBound: -1}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("big", tok(1000, 0))
	h.add("small", tok(1, 0))
	h.release("hold")
	if got := h.nextAdmitted(); got != "big" {
		t.Fatalf("FCFS admitted %s first, want big", got)
	}
}

// TestStarvationBoundProperty drives a random stream (mostly short
// requests, some long, random gaps and releases) and checks the
// guarantee at every admission: no request is admitted while an earlier
// request of its class has waited AgingBound or more.
func TestStarvationBoundProperty(t *testing.T) {
	t.Parallel()
	const bound = 3 * time.Second
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 42))
			h := newHarness(t, serial(Config{AgingBound: bound}), Deps{})
			arrived := map[string]time.Time{}
			admitted := map[string]time.Time{}
			// The pool is work-conserving with one slot and releases don't
			// depend on who holds it, so FCFS would use the very same
			// admission instants; fcfs replays them in arrival order.
			fcfsAt := map[string]time.Time{}
			var fcfs []string
			var slots []time.Time // every admission instant, in order
			var queued []string   // arrival order
			holder := ""
			check := func(name string) {
				now := h.clock.Now()
				for _, q := range queued {
					if q == name {
						break
					}
					if now.Sub(arrived[q]) >= bound {
						t.Fatalf("%s admitted at %v while older %s had waited %v ≥ bound",
							name, now.Sub(arrived["r0"]), q, now.Sub(arrived[q]))
					}
				}
				queued = slices.DeleteFunc(queued, func(q string) bool { return q == name })
				holder = name
				admitted[name] = now
				fcfsAt[fcfs[0]] = now
				fcfs = fcfs[1:]
				slots = append(slots, now)
			}
			maxWait := time.Duration(0)
			for range 1500 {
				h.clock.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
				for range rng.IntN(2) {
					name := fmt.Sprint("r", len(arrived))
					size := 10 + rng.IntN(40)
					if rng.IntN(10) == 0 {
						size = 2000 + rng.IntN(3000)
					}
					arrived[name] = h.clock.Now()
					queued = append(queued, name)
					fcfs = append(fcfs, name)
					h.add(name, tok(size, 0))
					if holder == "" { // pool idle: admitted at once
						check(h.nextAdmitted())
					}
				}
				if holder != "" && rng.IntN(10) < 6 {
					h.release(holder)
					holder = ""
					if len(queued) > 0 {
						name := h.nextAdmitted()
						maxWait = max(maxWait, h.clock.Now().Sub(arrived[name]))
						check(name)
					}
				}
			}
			h.none()
			// The consequence in slots: a request is admitted at most as many
			// admissions after its FCFS one as happened during its first
			// AgingBound of waiting (the younger ones that passed it then).
			// In time, that is about AgingBound beyond FCFS at a steady rate.
			index := func(at time.Time) int { // first slot at or after at
				i, _ := slices.BinarySearchFunc(slots, at, func(s, t time.Time) int { return s.Compare(t) })
				return i
			}
			var beyond time.Duration // most any request waited beyond FCFS
			for name, at := range admitted {
				beyond = max(beyond, at.Sub(fcfsAt[name]))
				window := index(arrived[name].Add(bound)) - index(arrived[name])
				if late := index(at) - index(fcfsAt[name]); late > window {
					t.Errorf("%s admitted %d admissions after FCFS would, more than the %d during its aging window", name, late, window)
				}
			}
			t.Logf("%d requests: max wait %v, max beyond FCFS %v (bound %v)", len(arrived), maxWait, beyond, bound)
		})
	}
}

func TestPriorityClasses(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{Classes: 3}), Deps{})
	h.admitNow("hold", tok(1, 0))
	h.add("low-small", tok(1, 0))
	h.add("mid", tok(500, 1))
	h.add("high-big", tok(5000, 2))
	h.add("clamped-high", tok(6000, 99)) // clamps to class 2
	h.add("clamped-low", tok(2, -7))     // clamps to class 0
	want := []string{"high-big", "clamped-high", "mid", "low-small", "clamped-low"}
	prev := "hold"
	for _, w := range want {
		h.release(prev)
		if prev = h.nextAdmitted(); prev != w {
			t.Fatalf("admitted %s, want %s", prev, w)
		}
	}
	if s := h.c.Stats(); s.Queued != 0 || s.InFlight != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestTenantFairness(t *testing.T) {
	t.Parallel()
	run := func(fair bool) []string {
		h := newHarness(t, serial(Config{TenantFairness: fair}), Deps{})
		h.admitNow("hold", tok(1, 0))
		// Tenant a bursts 6 requests, then b sends 3, all the same size.
		for i := range 6 {
			h.add(fmt.Sprint("a", i), Cost{PromptTokens: 100, Tenant: "a"})
		}
		for i := range 3 {
			h.add(fmt.Sprint("b", i), Cost{PromptTokens: 100, Tenant: "b"})
		}
		var got []string
		prev := "hold"
		for range 9 {
			h.release(prev)
			prev = h.nextAdmitted()
			got = append(got, prev)
		}
		return got
	}
	if got, want := run(true), []string{"a0", "b0", "a1", "b1", "a2", "b2", "a3", "a4", "a5"}; !slices.Equal(got, want) {
		t.Errorf("fair order %v, want %v", got, want)
	}
	if got, want := run(false), []string{"a0", "a1", "a2", "a3", "a4", "a5", "b0", "b1", "b2"}; !slices.Equal(got, want) {
		t.Errorf("unfair order %v, want %v", got, want)
	}
}

func TestFairnessChargesTokensNotRequests(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{TenantFairness: true}), Deps{})
	h.admitNow("hold", tok(1, 0))
	// a's requests are 4× the size of b's: b should get ~4 admissions per a.
	for i := range 3 {
		h.add(fmt.Sprint("a", i), Cost{PromptTokens: 400, Tenant: "a"})
	}
	for i := range 8 {
		h.add(fmt.Sprint("b", i), Cost{PromptTokens: 100, Tenant: "b"})
	}
	got := h.serialOrder("hold", 11)
	want := []string{"a0", "b0", "b1", "b2", "b3", "a1", "b4", "b5", "b6", "b7", "a2"}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestFairTenantJoinsWithoutBankedCredit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{TenantFairness: true}), Deps{})
	h.admitNow("hold", tok(1, 0))
	for i := range 4 {
		h.add(fmt.Sprint("a", i), Cost{PromptTokens: 100, Tenant: "a"})
	}
	prev := "hold"
	for _, w := range []string{"a0", "a1"} {
		h.release(prev)
		if prev = h.nextAdmitted(); prev != w {
			t.Fatalf("admitted %s, want %s", prev, w)
		}
	}
	// b was idle while a used the pool: it joins at the current virtual
	// time (a tie with a, which was active first) and alternates with a,
	// rather than spending banked credit on several turns in a row.
	h.add("b0", Cost{PromptTokens: 100, Tenant: "b"})
	h.add("b1", Cost{PromptTokens: 100, Tenant: "b"})
	var got []string
	for range 4 {
		h.release(prev)
		prev = h.nextAdmitted()
		got = append(got, prev)
	}
	if want := []string{"a2", "b0", "a3", "b1"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestFairCandidateThatDoesNotFitLetsShortestPass(t *testing.T) {
	t.Parallel()
	// The pool holds 1000 tokens. a's next (fair) request needs 900 while
	// 200 are in use; b's 50-token request fits and goes instead.
	h := newHarness(t, Config{TenantFairness: true, MaxOutstandingTokens: 1000}, Deps{})
	h.admitNow("hold", tok(200, 0))
	h.admitNow("hold2", tok(750, 0))
	h.add("a-big", Cost{PromptTokens: 900, Tenant: "a"})
	h.add("b-small", Cost{PromptTokens: 50, Tenant: "b"})
	h.release("hold2")
	if got := h.nextAdmitted(); got != "b-small" {
		t.Fatalf("admitted %s, want b-small", got)
	}
	h.release("b-small")
	h.none() // a-big still does not fit beside hold
	h.release("hold")
	if got := h.nextAdmitted(); got != "a-big" {
		t.Fatalf("admitted %s, want a-big", got)
	}
}
