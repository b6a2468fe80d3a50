package bench

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// SwapFloor is how few LoRA adapter swaps any placement of a run's
// requests could have made on its fleet: the yardstick for the engines'
// measured swaps (LoRASwaps), which a router can lower only down to it.
//
// Both bounds rest on one observation. At any moment the adapters
// resident in the fleet's GPU slots number at most Slots (the engines'
// max_lora, summed), and a request whose adapter is resident on no
// replica when it starts needs a swap somewhere. So the fleet's swaps are
// at least the misses of one cache of Slots adapters fed the same
// requests in order, whatever replica each went to. The zero value has
// no requests and says nothing.
type SwapFloor struct {
	// Slots are the fleet's GPU adapter slots the bounds assume.
	Slots int
	// Requests are the run's requests naming an adapter.
	Requests int
	// Offline is the fewest swaps of a placement that knew every request
	// in advance: Belady's optimal replacement over Slots, in the order
	// the requests were scheduled, with the first load into an empty slot
	// free (the fleet may start with any adapters resident). No placement
	// of these requests in this order does better.
	Offline int
	// Online is the fewest swaps to expect from a placement that learns
	// each request as it comes, when adapters are drawn independently by
	// their shares (bench's Zipf and weights mixes): whatever is resident,
	// a request hits it with probability at most the Slots largest shares'
	// sum. NaN when the requests were not drawn independently (a
	// round-robin mix), or no shares were given.
	Online float64
}

// PerKilo returns a count of swaps per 1,000 of the floor's requests (NaN
// without requests).
func (f SwapFloor) PerKilo(swaps float64) float64 {
	if f.Requests <= 0 {
		return math.NaN()
	}
	return 1000 * swaps / float64(f.Requests)
}

// LoRASwapFloor computes the floor of a run's records (their Model, in the
// order they were scheduled) over slots GPU adapter slots; shares are the
// mix's expected shares (AdapterMix.Shares), nil for a mix whose requests
// were not drawn independently. Records naming no adapter are left out.
func LoRASwapFloor(recs []Record, slots int, shares []float64) SwapFloor {
	type req struct {
		at    time.Duration
		i     int
		model string
	}
	seq := make([]req, 0, len(recs))
	for i := range recs {
		if recs[i].Model != "" {
			seq = append(seq, req{recs[i].Scheduled, i, recs[i].Model})
		}
	}
	slices.SortFunc(seq, func(a, b req) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.i, b.i)
	})
	models := make([]string, len(seq))
	for i, r := range seq {
		models[i] = r.model
	}
	f := SwapFloor{Slots: slots, Requests: len(models), Offline: beladyMisses(models, slots), Online: math.NaN()}
	if len(shares) > 0 && slots > 0 {
		s := slices.Clone(shares)
		slices.SortFunc(s, func(a, b float64) int { return cmp.Compare(b, a) })
		top := 0.0
		for _, x := range s[:min(slots, len(s))] {
			top += x
		}
		f.Online = float64(f.Requests) * max(1-top, 0)
	}
	return f
}

// beladyMisses counts the misses of Belady's optimal replacement (evict
// the adapter asked for again furthest in the future) over a cache of
// slots adapters, not counting a load into a free slot. With no slot
// every request misses.
func beladyMisses(seq []string, slots int) int {
	if slots <= 0 {
		return len(seq)
	}
	next := make([]int, len(seq)) // index of the same adapter's next request
	last := map[string]int{}
	for i := len(seq) - 1; i >= 0; i-- {
		n, ok := last[seq[i]]
		if !ok {
			n = math.MaxInt
		}
		next[i], last[seq[i]] = n, i
	}
	resident := map[string]int{} // adapter -> its next request
	misses := 0
	for i, m := range seq {
		if _, ok := resident[m]; !ok && len(resident) >= slots {
			victim, far := "", -1
			for a, n := range resident {
				if n > far || (n == far && a < victim) {
					victim, far = a, n
				}
			}
			delete(resident, victim)
			misses++
		}
		resident[m] = next[i]
	}
	return misses
}
