package admission

import (
	"errors"
	"fmt"
	"slices"
)

// Lane is a class of request length for length-based lanes.
type Lane uint8

// Lanes.
const (
	LaneShort Lane = iota // prompt under LaneConfig.LongPromptTokens (or lanes off)
	LaneLong              // prompt of at least LaneConfig.LongPromptTokens
)

func (l Lane) String() string {
	if l == LaneLong {
		return "long"
	}
	return "short"
}

// LaneConfig sends long prompts to a designated subset of replicas, so
// their prefills don't stall the decode of short requests everywhere. The
// zero value means no lanes: every replica serves every request.
//
// The balancer resolves IsLongReplica once per replica when it builds the
// pool, and asks Serves per candidate at pick time (no map on the hot path).
// When no replica of a request's lane is available the balancer may fall
// back to any replica; the rule says which replicas are preferred, not that
// the request must fail.
type LaneConfig struct {
	// LongPromptTokens is the prompt size, in tokens, from which a request
	// is in the long lane. 0 means lanes are off.
	LongPromptTokens int
	// LongReplicas names the replicas (balancer replica names) that serve
	// the long lane. Empty means every replica does, i.e. lanes are off.
	LongReplicas []string
	// Dedicated, when true, keeps short requests off the long replicas;
	// otherwise long replicas also take short requests.
	Dedicated bool
}

// Validate reports every invalid field.
func (l LaneConfig) Validate() error {
	var errs []error
	if l.LongPromptTokens < 0 {
		errs = append(errs, fmt.Errorf("admission: Lanes.LongPromptTokens = %d: must not be negative (0 for no lanes)", l.LongPromptTokens))
	}
	if l.LongPromptTokens > 0 && len(l.LongReplicas) == 0 {
		errs = append(errs, errors.New("admission: Lanes.LongPromptTokens is set but Lanes.LongReplicas is empty"))
	}
	return errors.Join(errs...)
}

// Enabled reports whether lanes apply at all.
func (l LaneConfig) Enabled() bool { return l.LongPromptTokens > 0 && len(l.LongReplicas) > 0 }

// LaneOf is the lane of a request of cost c.
func (l LaneConfig) LaneOf(c Cost) Lane {
	if l.Enabled() && c.PromptTokens >= l.LongPromptTokens {
		return LaneLong
	}
	return LaneShort
}

// IsLongReplica reports whether the named replica serves the long lane.
func (l LaneConfig) IsLongReplica(name string) bool {
	return l.Enabled() && slices.Contains(l.LongReplicas, name)
}

// Serves reports whether a replica (longReplica as IsLongReplica said)
// serves requests of the lane.
func (l LaneConfig) Serves(longReplica bool, lane Lane) bool {
	switch {
	case !l.Enabled():
		return true
	case lane == LaneLong:
		return longReplica
	default:
		return !longReplica || !l.Dedicated
	}
}
