package admission

import (
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// loadList is a LoadSource returning fixed loads.
type loadList []balancer.ReplicaLoad

func (l loadList) Loads(_ time.Time, dst []balancer.ReplicaLoad) []balancer.ReplicaLoad {
	return append(dst, l...)
}

// A request is not admitted on the strength of a replica where it would
// finish later than on another by more than the time it may still wait:
// held, it goes to the faster replica when that one has room. Here the
// fast replica is out of room (its prefill queue over MaxPrefillWait) and
// the half-speed one has room: a 400-token output would finish ≈ 17 s
// from now on fast, ≈ 32 s on slow, so with 1.5 s left before its
// deadline it waits; a 20-token one finishes about as soon on either and
// is admitted; without a deadline, or with the output unknown, room alone
// decides.
func TestAdmissionHoldsARequestThatWouldFinishLateWhereThereIsRoom(t *testing.T) {
	now := time.Unix(1000, 0)
	fast := balancer.ReplicaLoad{PrefillWait: 1200 * time.Millisecond, TPOT: 40 * time.Millisecond}
	slow := balancer.ReplicaLoad{TPOT: 80 * time.Millisecond}
	c := &poolCapacity{pool: loadList{fast, slow}, sat: SaturationConfig{}, clock: fixedClock{now}}
	deadline := now.Add(1500 * time.Millisecond)
	for _, tc := range []struct {
		name string
		cost Cost
		want bool
	}{
		{"400 output tokens", Cost{PromptTokens: 1000, OutputTokens: 400, Deadline: deadline}, false},
		{"20 output tokens", Cost{PromptTokens: 1000, OutputTokens: 20, Deadline: deadline}, true},
		{"no deadline", Cost{PromptTokens: 1000, OutputTokens: 400}, true},
		{"output unknown", Cost{PromptTokens: 1000, Deadline: deadline}, true},
	} {
		if got := c.Admissible(tc.cost); got != tc.want {
			t.Errorf("%s: Admissible = %v, want %v", tc.name, got, tc.want)
		}
	}
	// Once fast has room, the long request is admitted (and the balancer
	// places it there: balancer's late rule).
	fast.PrefillWait = 200 * time.Millisecond
	c.pool = loadList{fast, slow}
	if !c.Admissible(Cost{PromptTokens: 1000, OutputTokens: 400, Deadline: deadline}) {
		t.Error("refused a long request with the fast replica's room back")
	}
	// A replica that is resting or stale is no one's soonest finish.
	fast.PrefillWait, fast.Resting = 1200*time.Millisecond, true
	c.pool = loadList{fast, slow}
	if !c.Admissible(Cost{PromptTokens: 1000, OutputTokens: 400, Deadline: deadline}) {
		t.Error("held a request for a resting replica")
	}
}
