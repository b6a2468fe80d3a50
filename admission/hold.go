package admission

// Hold is why a replica has no room for a request under the saturation
// rule (SaturationConfig.HoldOn), or why the pool as a whole holds it
// (HoldLate, HoldShortLane): the label of gpurouter_admission_held_total,
// so an operator sees which rule keeps requests waiting at the router.
// The zero value, HoldNone, means the replica has room.
type Hold uint8

// Holds, in the order the rule checks them.
const (
	HoldNone        Hold = iota
	HoldStale            // telemetry older than the staleness bound
	HoldResting          // resting after a 429/503
	HoldWaiting          // the engine keeps a waiting queue
	HoldKVUsage          // the engine's KV full: at the threshold (capacity unknown), or the prompt not fitting in what is free
	HoldPrefillWait      // the router's queued prefill there at MaxPrefillWait
	HoldTokenBudget      // the router's KV peak there plus this request over the budget
	HoldITL              // streaming slower than MaxITLShare of the request's TPOT objective
	HoldHeadroom         // its prefill would push a decoding request past its TPOT objective
	HoldLongPrefill      // the replica's long-prefill lanes are taken
	HoldLate             // it would finish later than on another replica by more than it may wait
	HoldShortLane        // a long prefill would take the last replica kept for short ones
	numHolds
)

var holdNames = [numHolds]string{"none", "stale", "resting", "waiting", "kv_usage", "prefill_wait",
	"token_budget", "itl", "headroom", "long_prefill", "late", "short_lane"}

func (h Hold) String() string {
	if h < numHolds {
		return holdNames[h]
	}
	return "unknown"
}
