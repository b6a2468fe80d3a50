package admission

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestSaturationRule(t *testing.T) {
	t.Parallel()
	def := SaturationConfig{}
	short, long := tok(100, 0), tok(5000, 0)
	tests := []struct {
		name      string
		cfg       SaturationConfig
		load      ReplicaLoad
		cost      Cost
		saturated bool
		fits      bool
		hold      Hold
	}{
		{"idle", def, ReplicaLoad{}, short, false, true, HoldNone},
		{"stale counts as saturated", def, ReplicaLoad{Stale: true}, short, true, false, HoldStale},
		{"engine waiting", def, ReplicaLoad{Waiting: 1}, short, true, false, HoldWaiting},
		{"waiting allowed", SaturationConfig{MaxWaiting: 2}, ReplicaLoad{Waiting: 2}, short, false, true, HoldNone},
		{"waiting ignored", SaturationConfig{MaxWaiting: -1}, ReplicaLoad{Waiting: 50}, short, false, true, HoldNone},
		{"kv at threshold", def, ReplicaLoad{KVUsage: 0.9}, short, true, false, HoldKVUsage},
		{"kv below threshold", def, ReplicaLoad{KVUsage: 0.89}, short, false, true, HoldNone},
		{"kv ignored", SaturationConfig{KVUsageThreshold: -1}, ReplicaLoad{KVUsage: 1}, short, false, true, HoldNone},
		// Capacity known: the engine's own rule, the prompt in the free KV
		// above vLLM's 1% watermark (7,000 of 100,000 tokens free at 92%).
		{"kv past the threshold, a prompt that fits", def, ReplicaLoad{KVUsage: 0.92, KVCapacityTokens: 100000}, tok(6000, 0), false, true, HoldNone},
		{"kv past the threshold, a prompt that does not fit", def, ReplicaLoad{KVUsage: 0.92, KVCapacityTokens: 100000}, tok(8000, 0), false, false, HoldKVUsage},
		{"kv at the watermark", def, ReplicaLoad{KVUsage: 0.99, KVCapacityTokens: 100000}, short, true, false, HoldKVUsage},
		{"capacity unknown: the threshold alone", SaturationConfig{KVUsageThreshold: 1}, ReplicaLoad{KVUsage: 0.995}, short, false, true, HoldNone},
		{"kv free, capacity known, ignored", SaturationConfig{KVUsageThreshold: -1}, ReplicaLoad{KVUsage: 0.995, KVCapacityTokens: 100000}, tok(8000, 0), false, true, HoldNone},
		{"budget used up", def, ReplicaLoad{KVCapacityTokens: 10000, OutstandingTokens: 10000}, short, true, false, HoldTokenBudget},
		{"request over remaining budget", def, ReplicaLoad{KVCapacityTokens: 10000, OutstandingTokens: 9950}, short, false, false, HoldTokenBudget},
		{"request within budget", def, ReplicaLoad{KVCapacityTokens: 10000, OutstandingTokens: 9900}, short, false, true, HoldNone},
		{"empty replica takes a huge request", def, ReplicaLoad{KVCapacityTokens: 1000}, tok(50000, 0), false, true, HoldNone},
		{"budget ratio", SaturationConfig{TokenBudgetRatio: 2}, ReplicaLoad{KVCapacityTokens: 10000, OutstandingTokens: 15000}, short, false, true, HoldNone},
		{"budget off", SaturationConfig{TokenBudgetRatio: -1}, ReplicaLoad{KVCapacityTokens: 10, OutstandingTokens: 1e9}, short, false, true, HoldNone},
		{"capacity unknown: no budget", def, ReplicaLoad{OutstandingTokens: 1e9}, short, false, true, HoldNone},
		{"long prefill lane taken", def, ReplicaLoad{LongPrefills: 1}, long, false, false, HoldLongPrefill},
		{"short passes a taken long lane", def, ReplicaLoad{LongPrefills: 1}, short, false, true, HoldNone},
		{"two long lanes", SaturationConfig{MaxLongPrefills: 2}, ReplicaLoad{LongPrefills: 1}, long, false, true, HoldNone},
		{"long lanes uncapped", SaturationConfig{MaxLongPrefills: -1}, ReplicaLoad{LongPrefills: 9}, long, false, true, HoldNone},
		{"long threshold off", SaturationConfig{LongPrefillTokens: -1}, ReplicaLoad{LongPrefills: 9}, long, false, true, HoldNone},
		// 400 µs a prompt token against 0.5 s of decode headroom: 1,000
		// tokens stall the decodes there 0.4 s, 4,000 tokens 1.6 s.
		{"prefill within the decode headroom", def, ReplicaLoad{HeadroomKnown: true, Headroom: 500 * time.Millisecond, PrefillPerToken: 400 * time.Microsecond}, tok(1000, 0), false, true, HoldNone},
		{"prefill past the decode headroom", def, ReplicaLoad{HeadroomKnown: true, Headroom: 500 * time.Millisecond, PrefillPerToken: 400 * time.Microsecond}, tok(4000, 0), false, false, HoldHeadroom},
		{"decode headroom unknown", def, ReplicaLoad{Headroom: 0, PrefillPerToken: 400 * time.Microsecond}, tok(4000, 0), false, true, HoldNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.cfg.Saturated(tt.load); got != tt.saturated {
				t.Errorf("Saturated = %v, want %v", got, tt.saturated)
			}
			if got := tt.cfg.Fits(tt.load, tt.cost); got != tt.fits {
				t.Errorf("Fits = %v, want %v", got, tt.fits)
			}
			if got := tt.cfg.HoldOn(tt.load, tt.cost); got != tt.hold {
				t.Errorf("HoldOn = %v, want %v", got, tt.hold)
			}
			if l := tt.cfg.Level(tt.load); tt.saturated != (l >= 1) {
				t.Errorf("Level = %v, inconsistent with Saturated = %v", l, tt.saturated)
			}
		})
	}
}

func TestSaturationLevel(t *testing.T) {
	t.Parallel()
	s := SaturationConfig{MaxWaiting: 3}
	if got := s.Level(ReplicaLoad{Waiting: 2, KVUsage: 0.45, OutstandingTokens: 100}); got != 0.5 {
		t.Fatalf("Level = %v, want 0.5 (the larger of 2/4, 0.45/0.9)", got)
	}
	if got := s.Level(ReplicaLoad{KVUsage: 0.891, KVCapacityTokens: 1000, OutstandingTokens: 100}); math.Abs(got-0.9) > 1e-9 {
		t.Fatalf("Level = %v, want 0.9 (0.891 of the KV over the 0.99 below vLLM's watermark)", got)
	}
}

func TestSaturationValidate(t *testing.T) {
	t.Parallel()
	for _, s := range []SaturationConfig{{KVUsageThreshold: 1.5}, {KVUsageThreshold: math.NaN()}, {TokenBudgetRatio: math.Inf(1)}} {
		if s.Validate() == nil {
			t.Errorf("%+v: want an error", s)
		}
	}
}

func TestLanes(t *testing.T) {
	t.Parallel()
	off := LaneConfig{}
	shared := LaneConfig{LongPromptTokens: 8000, LongReplicas: []string{"r3", "r4"}}
	dedicated := shared
	dedicated.Dedicated = true
	tests := []struct {
		name     string
		cfg      LaneConfig
		replica  string
		prompt   int
		lane     Lane
		eligible bool
	}{
		{"off: long anywhere", off, "r1", 100000, LaneShort, true},
		{"long on long replica", shared, "r3", 8000, LaneLong, true},
		{"long off long replicas", shared, "r1", 9000, LaneLong, false},
		{"short on long replica (shared)", shared, "r4", 7999, LaneShort, true},
		{"short on long replica (dedicated)", dedicated, "r4", 10, LaneShort, false},
		{"short on other replica", dedicated, "r1", 10, LaneShort, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lane := tt.cfg.LaneOf(tok(tt.prompt, 0))
			if lane != tt.lane {
				t.Fatalf("LaneOf = %v, want %v", lane, tt.lane)
			}
			if got := tt.cfg.Serves(tt.cfg.IsLongReplica(tt.replica), lane); got != tt.eligible {
				t.Fatalf("Serves = %v, want %v", got, tt.eligible)
			}
		})
	}
	if err := (LaneConfig{LongPromptTokens: 10}).Validate(); err == nil || !strings.Contains(err.Error(), "LongReplicas") {
		t.Fatalf("Validate = %v", err)
	}
	if LaneLong.String() != "long" || LaneShort.String() != "short" {
		t.Fatal("lane names")
	}
}
