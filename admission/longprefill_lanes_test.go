package admission

import (
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// The line between long and short prefills follows the pool's speed: on
// H100s a 14,000-token prompt (0.5 s) is short and 32,000 tokens (1.15 s)
// long; on A10s (250 µs a token) 14,000 tokens take 3.5 s, long, and the
// lanes keep it off a replica already in one and off the last replica
// free of one, as they kept 4,096-token prompts there before (issue 14).
func TestLongPrefillLanesFollowThePoolsSpeed(t *testing.T) {
	now := time.Unix(1000, 0)
	busy := func(perToken time.Duration, long int) balancer.ReplicaLoad {
		return balancer.ReplicaLoad{KVUsage: 0.15, KVCapacityTokens: 1_600_000, PrefillPerToken: perToken, LongPrefills: long}
	}
	prompt := Cost{PromptTokens: 14_000, OutputTokens: 340}
	h100 := 36 * time.Microsecond
	c := &poolCapacity{pool: loadList{busy(h100, 0), busy(2*h100, 0)}, sat: SaturationConfig{}, clock: fixedClock{now}}
	c.Admissible(prompt)
	if c.perToken != h100 {
		t.Fatalf("pool's fastest rate %v, want %v", c.perToken, h100)
	}
	if got := c.sat.LongPrefillCap(prompt, c.perToken); got != 0 {
		t.Errorf("a 0.5 s prefill got a long-prefill cap of %d", got)
	}
	if got := c.sat.LongPrefillCap(Cost{PromptTokens: 32_000}, c.perToken); got != 1 {
		t.Errorf("a 1.15 s prefill got cap %d, want 1", got)
	}
	if got := (SaturationConfig{LongPrefillTokens: 4096}).LongPrefillCap(prompt, c.perToken); got != 1 {
		t.Errorf("long_prefill_tokens 4096: a 14,000-token prompt got cap %d, want 1", got)
	}
	if got := (SaturationConfig{LongPrefillTokens: -1}).LongPrefillCap(Cost{PromptTokens: 1 << 20}, c.perToken); got != 0 {
		t.Errorf("lanes off: cap %d", got)
	}

	// On A10s the same prompt is 3.5 s of prefill: long. With a long
	// prefill on three replicas, the fourth is the short lane.
	a10 := 250 * time.Microsecond
	slow := loadList{busy(a10, 1), busy(a10, 1), busy(a10, 1), busy(a10, 0)}
	c = &poolCapacity{pool: slow, sat: SaturationConfig{}, clock: fixedClock{now}}
	if c.Admissible(prompt) {
		t.Error("a 3.5 s prefill took the last A10 free of long prefills")
	}
	if !c.Admissible(Cost{PromptTokens: 2_000, OutputTokens: 100}) {
		t.Error("a 0.5 s prefill was held on the A10s")
	}
	var why []Hold
	c.holds(prompt, func(h Hold) { why = append(why, h) })
	want := []Hold{HoldLongPrefill, HoldLongPrefill, HoldLongPrefill, HoldShortLane}
	if len(why) != len(want) {
		t.Fatalf("holds %v, want %v", why, want)
	}
	for i := range want {
		if why[i] != want[i] {
			t.Fatalf("holds %v, want %v", why, want)
		}
	}
}
