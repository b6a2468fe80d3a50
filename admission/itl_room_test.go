package admission

import (
	"math"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// A request with a TPOT objective finds no room on a replica already
// streaming at MaxITLShare of it: the half-speed replica of a fleet,
// filled until its decodes ran right at the objective, served most of
// them over it. A request without an objective, or a replica streaming
// nothing, is not judged by it; a negative share turns the rule off.
func TestTPOTObjectiveNeedsAReplicaStreamingFasterThanIt(t *testing.T) {
	s := SaturationConfig{}
	c := Cost{PromptTokens: 1000, OutputTokens: 400, TPOT: 100 * time.Millisecond}
	for _, tc := range []struct {
		itl  time.Duration
		want bool
	}{
		{0, true}, // nothing streaming there
		{50 * time.Millisecond, true},
		{84 * time.Millisecond, true},
		{85 * time.Millisecond, false}, // 0.85 of the objective
		{120 * time.Millisecond, false},
	} {
		if got := s.Fits(balancer.ReplicaLoad{ITL: tc.itl}, c); got != tc.want {
			t.Errorf("ITL %v, TPOT objective 100ms: Fits = %v, want %v", tc.itl, got, tc.want)
		}
	}
	slow := balancer.ReplicaLoad{ITL: 120 * time.Millisecond}
	if !s.Fits(slow, Cost{PromptTokens: 1000, OutputTokens: 400}) {
		t.Error("a request without a TPOT objective was refused for the replica's ITL")
	}
	if !(SaturationConfig{MaxITLShare: -1}).Fits(slow, c) {
		t.Error("MaxITLShare -1 must ignore TPOT objectives")
	}
	if !s.Admissible([]balancer.ReplicaLoad{slow, {ITL: 40 * time.Millisecond}}, c) {
		t.Error("refused with one replica streaming well under the objective")
	}
	if s.Admissible([]balancer.ReplicaLoad{slow, slow}, c) {
		t.Error("admitted with every replica streaming over the objective: it must wait at the router")
	}
}

// The room rule the balancer applies when placing an admitted request
// passes the request's TPOT objective through.
func TestRoomRuleAppliesTheRequestsTPOTObjective(t *testing.T) {
	r := &roomRule{sat: SaturationConfig{}}
	slow := balancer.ReplicaLoad{ITL: 95 * time.Millisecond}
	if r.FitsReplica(slow, 1000, 400, 100*time.Millisecond) {
		t.Error("room on a replica streaming at 95ms for a 100ms TPOT objective")
	}
	if !r.FitsReplica(slow, 1000, 400, 200*time.Millisecond) {
		t.Error("no room on a replica streaming at 95ms for a 200ms TPOT objective")
	}
}

func TestMaxITLShareMustBeFinite(t *testing.T) {
	for _, v := range []float64{math.NaN(), math.Inf(1)} {
		if (SaturationConfig{MaxITLShare: v}).Validate() == nil {
			t.Errorf("MaxITLShare %v accepted", v)
		}
	}
	if err := (SaturationConfig{MaxITLShare: -1}).Validate(); err != nil {
		t.Errorf("MaxITLShare -1 (off) refused: %v", err)
	}
}
