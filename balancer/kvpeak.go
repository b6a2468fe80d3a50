package balancer

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"
)

// The fullest a replica's KV cache will be with the router's requests in
// flight there: what admission's token budget is spent against
// (ReplicaLoad.OutstandingTokens).
//
// Reserving each request's whole footprint (prompt plus expected output)
// from placement to end counts every request at its final size at once.
// But a request decoding holds its prompt and the tokens made so far, one
// more each engine step, and frees all of it when it ends: some requests
// are near their end while others start. For 10–20 requests spread over
// their decode the most they will hold at once is ~88% of the sum. On the
// conversation trace at 85% load (bench/scripts/vs-haproxy.sh) ~40
// requests a run, 1,100-token prompts asking for 400 tokens in the
// bursts, were shed while the sum said the full-speed replicas were full.
//
// The model: every request decoding makes one token per engine step until
// its expected output (continuous batching runs each in every step). A
// request not yet past its first token, not streamed (no progress seen),
// past its expected output, or of unknown output counts at its whole
// footprint (or what it holds, if more) until it ends, as the sum counted
// it: the peak is never below what those hold.

// kvRefresh is how long a computed peak serves before it is computed
// again. In between, time only lowers the model's peak (every request
// counted as growing is a step nearer its end; one past its expected
// output adds the few tokens it makes meanwhile), a request placed adds
// its whole footprint, and a request ending makes the next read compute
// it anew, so that its room shows at once.
const kvRefresh = 5 * time.Millisecond

// kvLedger is a replica's requests in flight with a KV footprint. The zero
// value is empty and ready.
type kvLedger struct {
	mu      sync.Mutex
	live    []*leaseState
	scratch []kvEntry
	bound   int64 // the peak as of at, plus the footprints added since
	at      int64 // unix nanos of the computation
	fresh   bool  // bound holds since at: no request ended since
}

// kvEntry is one request in the peak's model: held tokens now, growing by
// one a step (grow 1) or not (0), until left steps from now
// (math.MaxInt64: until it ends, unknown when).
type kvEntry struct{ held, grow, left int64 }

// add counts st (its kv > 0) in flight.
func (k *kvLedger) add(st *leaseState) {
	k.mu.Lock()
	st.ledgerAt = len(k.live)
	k.live = append(k.live, st)
	k.bound += st.kv
	k.mu.Unlock()
}

// remove takes st out; the next peak is computed anew.
func (k *kvLedger) remove(st *leaseState) {
	k.mu.Lock()
	if i := st.ledgerAt; i >= 0 && i < len(k.live) && k.live[i] == st {
		last := len(k.live) - 1
		k.live[i] = k.live[last]
		k.live[i].ledgerAt = i
		k.live[last] = nil
		k.live = k.live[:last]
	}
	st.ledgerAt = -1
	k.fresh = false
	k.mu.Unlock()
}

// peak returns the most KV-cache tokens the requests in flight will hold
// at once from now on, as the model says (kvRefresh: how fresh).
func (k *kvLedger) peak(now time.Time) int64 {
	n := now.UnixNano()
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.fresh || n-k.at >= int64(kvRefresh) || n < k.at {
		k.bound, k.at, k.fresh = k.compute(), n, true
	}
	return k.bound
}

// compute is the peak of the live requests' model: between two ends the
// held total rises by the growing requests' count each step, so the
// peak is at the step before some request ends.
func (k *kvLedger) compute() int64 {
	es := k.scratch[:0]
	for _, st := range k.live {
		es = append(es, st.kvEntry())
	}
	k.scratch = es[:0]
	slices.SortFunc(es, func(a, b kvEntry) int { return cmp.Compare(a.left, b.left) })
	var best, held, grow int64
	for j := len(es) - 1; j >= 0; j-- {
		// Entries j.. are the ones alive until the step before es[j] ends.
		held += es[j].held
		grow += es[j].grow
		// An entry lasting forever grows not, nor do those after it: grow
		// is 0 wherever left is unbounded.
		t := max(es[j].left-1, 0)
		best = max(best, held+grow*t)
	}
	return best
}

// kvEntry is st in the peak's model (see the file's comment).
func (st *leaseState) kvEntry() kvEntry {
	made := st.made.Load()
	if made < 1 || st.output <= 0 || made >= st.output {
		return kvEntry{held: st.kv + max(made-st.output, 0), left: math.MaxInt64}
	}
	return kvEntry{held: st.kv - st.output + made, grow: 1, left: st.output - made}
}
