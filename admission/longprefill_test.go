package admission

import (
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// A long prompt is long for the time it holds an engine's prefill, not for
// its token count. Four H100 replicas (Qwen3.5-9B prefills ~28,000 tokens
// a second: 36 µs a token) each prefilling one 14,000-token prompt — half
// a second queued, the KV cache 15% full — have room for the next
// 14,000-token prompt: a request sent now starts within half a second.
// Counted long by tokens (≥ 4,096), one long prefill a replica and one
// replica kept for short prompts held it at the router instead, and on a
// production trace of such prompts goodput fell to a third of HAProxy's
// while every engine had free KV (issue 50). On an A10 (4,000 tokens a
// second: 250 µs a token) the same prompt takes 3.5 s: long, and the
// lanes still keep it off a replica already in one and off the last
// replica free of one.
func TestLongPrefillIsMeasuredInPrefillTime(t *testing.T) {
	now := time.Unix(1000, 0)
	busy := func(perToken time.Duration, long int) balancer.ReplicaLoad {
		return balancer.ReplicaLoad{
			KVUsage: 0.15, KVCapacityTokens: 1_600_000, OutstandingTokens: 240_000,
			PrefillPerToken: perToken, PrefillWait: 14_000 * perToken, LongPrefills: long,
		}
	}
	prompt := Cost{PromptTokens: 14_000, OutputTokens: 340}
	h100 := 36 * time.Microsecond
	// Replicas whose router-side count says each holds a long prefill
	// (as the token rule counted them) — the time rule ignores the count
	// for a prompt that is not long at the pool's rate.
	fleet := loadList{busy(h100, 1), busy(h100, 1), busy(h100, 1), busy(h100, 1)}
	for i := range fleet {
		fleet[i].PrefillWait = 500 * time.Millisecond
	}
	c := &poolCapacity{pool: fleet, sat: SaturationConfig{}, clock: fixedClock{now}}
	if !c.Admissible(prompt) {
		t.Fatal("a 14,000-token prompt held while four H100 engines each have half a second of prefill queued and free KV")
	}
	// The controller admits them at once: nothing waits at the router.
	ctl, err := New("m", Config{}, Deps{Pool: fleet, Clock: fixedClock{now}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		tk, ok := ctl.TryAdmit(prompt)
		if !ok {
			t.Fatalf("request %d held at the router", i)
		}
		if tk.LongPrefillCap() != 0 {
			t.Errorf("request %d: ticket capped as a long prefill", i)
		}
		defer tk.Release()
	}
}
