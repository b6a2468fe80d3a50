package admission

import (
	"slices"
	"testing"
	"time"
)

// cachedTurn is a follow-up turn of n prompt tokens whose history, all
// but its last `fresh` tokens, a replica holds in its prefix cache.
func cachedTurn(n, fresh int) Cost {
	c := tok(n, 0)
	c.SetCached(n - fresh)
	return c
}

// A prompt a replica holds most of in its prefix cache costs it only the
// rest: the decode headroom, the long-prefill lanes and the token budget
// judge that, while Tokens still counts the whole prompt.
func TestCachedPromptIsNotPrefill(t *testing.T) {
	t.Parallel()
	def := SaturationConfig{}
	// 400 µs a prompt token against 0.5 s of decode headroom.
	headroom := ReplicaLoad{HeadroomKnown: true, Headroom: 500 * time.Millisecond, PrefillPerToken: 400 * time.Microsecond}
	if h := def.HoldOn(headroom, tok(14000, 0)); h != HoldHeadroom {
		t.Errorf("a whole 14,000-token prefill: %v, want %v", h, HoldHeadroom)
	}
	if h := def.HoldOn(headroom, cachedTurn(14000, 600)); h != HoldNone {
		t.Errorf("the same prompt with all but 600 tokens cached: %v, want %v", h, HoldNone)
	}
	lane := ReplicaLoad{LongPrefills: 1}
	if h := def.HoldOn(lane, tok(40000, 0)); h != HoldLongPrefill {
		t.Errorf("a 40,000-token prefill beside another long one: %v, want %v", h, HoldLongPrefill)
	}
	if h := def.HoldOn(lane, cachedTurn(40000, 600)); h != HoldNone {
		t.Errorf("40,000 tokens, all but 600 cached, beside a long prefill: %v, want %v", h, HoldNone)
	}
	budget := ReplicaLoad{KVCapacityTokens: 100000, OutstandingTokens: 90000}
	if h := def.HoldOn(budget, tok(14000, 0)); h != HoldTokenBudget {
		t.Errorf("14,000 new KV tokens over a budget with 10,000 left: %v, want %v", h, HoldTokenBudget)
	}
	if h := def.HoldOn(budget, cachedTurn(14000, 600)); h != HoldNone {
		t.Errorf("600 new KV tokens within it: %v, want %v", h, HoldNone)
	}
	if c := cachedTurn(14000, 600); c.Tokens() != 14000 || c.charge() != 608 {
		t.Errorf("Tokens %d, charge %d: want 14000 (the whole prompt) and 608 (what is not cached, to a block of %d)", c.Tokens(), c.charge(), cachedUnit)
	}
}

// Queued, a turn whose history is cached goes by what it still has to
// prefill: before a cold prompt a tenth of its size.
func TestCachedTurnQueuesByWhatItMustPrefill(t *testing.T) {
	t.Parallel()
	h := newHarness(t, serial(Config{}), Deps{})
	h.admitNow("hold", tok(10, 0))
	h.add("cold", tok(1400, 0))
	h.add("cached", cachedTurn(14000, 300))
	h.add("whole", tok(14000, 0))
	if got, want := h.serialOrder("hold", 3), []string{"cached", "cold", "whole"}; !slices.Equal(got, want) {
		t.Fatalf("admission order %v, want %v", got, want)
	}
}
