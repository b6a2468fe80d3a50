package balancer

import (
	"sync/atomic"
	"time"
)

// Lease is one request's hold on a replica, from Acquire to Done. It is
// used by one goroutine at a time (the request's).
type Lease struct {
	r    *Replica
	done func(error)
	st   *leaseState // nil for a zero Lease
}

// leaseState is what a lease still holds on its replica's counters.
type leaseState struct {
	remaining int64 // estimated work not yet done, in decode-token equivalents
	kv        int64 // KV-cache footprint reserved, in tokens
	long      bool  // counted in the replica's long prefills (until the first token)

	// The predictor's view of the request (predict.go): its prompt, still
	// counted in the replica's queued prefill until the first token; when
	// it was sent; the TTFT fit's x for it and the TTFT predicted then; the
	// requests in flight it joined (the TPOT fit's x).
	prefilling bool // beside long: the state keeps to its size class
	prompt     int64
	sentNs     int64
	x          float64
	waitX      float64 // requests waiting in the engine ahead of it at send
	predTTFT   float64
	inFlight   float64
	decodeFrom int64 // the replica's promptSent at the first token

	aliveNs int64 // the caller's clock at the last AliveAt that stamped the replica

	// For the replica's decode headroom (headroom.go): the expected
	// output (0 unknown), the TPOT objective (seconds; 0: the pool's),
	// the gaps seen since the first token and their sum in seconds.
	output  int64
	tpotObj float64
	gaps    int64
	decodeS float64

	// For the replica's KV peak (kvpeak.go): output tokens made so far
	// (chunks; 0 until the first token), read by admission's goroutine;
	// the lease's place in the replica's ledger (under its lock).
	made     atomic.Int64
	ledgerAt int

	adapter uint64 // adapterKey of the LoRA adapter counted in the replica's table; 0: none
}

// LeaseCost is what a request brings to the replica it is placed on, for
// AcquireRequest. The zero value is a request of unknown size.
type LeaseCost struct {
	Work         int64 // weighted prompt plus expected output, in decode-token equivalents (see AcquireCost)
	KV           int64 // KV-cache footprint to reserve, in tokens (see AcquireCostKV)
	Long         bool  // counted as a long prefill until PrefillDone
	PromptTokens int64 // prefill work queued on the replica until the first token — the prompt less what the replica has cached (Request.CachedTokens); 0 = unknown
	// Prefix is the request's prompt blocks (Request.Prefix): recorded as
	// held by the replica when its pool's prefix index is approximate.
	Prefix []uint64
	// CachedTokens is the prompt tokens the pool's index says the
	// replica holds (Request.CachedTokens): PromptTokens excludes them.
	CachedTokens int64
	// MostCached is the most of the prompt any replica of the pool held,
	// as the index said (Request.MostCachedTokens): what it holds beyond
	// CachedTokens is cache the placement gave up, for load or an
	// objective. 0 = none, or not known.
	MostCached   int64
	OutputTokens int64 // expected output tokens, for the replica's decode headroom; 0 = unknown
	// TPOTObjective is the request's TPOT objective (its SLO header); 0
	// means the pool's (ScoreConfig.SLOTPOT).
	TPOTObjective time.Duration
	// Adapter is the LoRA adapter the request runs (Pool.AdapterOf):
	// counted on the replica until Done, so that the next request for it
	// goes where it runs. "" for the base model.
	Adapter string
}

// Acquire asks the breaker for permission and counts the request in flight.
// It fails with ErrBreakerOpen when the breaker refuses. The caller must call
// Done exactly once, when the response has ended (stream closed).
func (r *Replica) Acquire() (Lease, error) { return r.AcquireCost(0) }

// AcquireCost is Acquire for a request expected to cost work tokens
// (weighted prompt plus expected output), which the replica counts as
// outstanding until Progress or Done takes it back.
func (r *Replica) AcquireCost(work int64) (Lease, error) { return r.AcquireCostKV(work, 0, false) }

// AcquireCostKV is AcquireCost that also reserves the request's KV-cache
// footprint (prompt plus expected output, in tokens) until Done, and counts
// it as a long prefill until PrefillDone when long is set: the numbers an
// admission controller needs to tell whether the replica can take more.
func (r *Replica) AcquireCostKV(work, kv int64, long bool) (Lease, error) {
	return r.AcquireRequest(LeaseCost{Work: work, KV: kv, Long: long})
}

// AcquireRequest is AcquireCostKV that also queues the request's prompt
// as prefill work on the replica until its first token, which teaches the
// replica's latency predictor (PrefillDone, ObserveDecode) and lets the
// predictive policy see the prefill a new request would wait behind.
func (r *Replica) AcquireRequest(c LeaseCost) (Lease, error) {
	done, err := r.breaker.Allow()
	if err != nil {
		return Lease{}, ErrBreakerOpen
	}
	n := r.inFlight.Add(1)
	if g := r.group.Load(); g != nil {
		g.Add(1)
	}
	r.served.Add(1)
	st := &leaseState{remaining: max(c.Work, 0), kv: max(c.KV, 0), long: c.Long, output: max(c.OutputTokens, 0), tpotObj: c.TPOTObjective.Seconds()}
	r.tel.outstanding.Add(st.remaining)
	r.kvReserved.Add(st.kv)
	if st.kv > 0 {
		r.kv.add(st)
	}
	if c.Long {
		r.longPrefills.Add(1)
	}
	r.recordPlacement(c.Prefix, c.PromptTokens, c.CachedTokens, c.MostCached)
	if c.Adapter != "" {
		st.adapter = adapterKey(c.Adapter)
		r.lora.acquire(st.adapter, r.now().UnixNano())
	}
	if c.PromptTokens > 0 || st.output > 1 {
		now := r.now() // one reading for the send and what it is judged by
		if c.PromptTokens > 0 {
			st.prompt, st.prefilling = c.PromptTokens, true
			st.x, st.waitX, st.predTTFT = r.startPrefill(c.PromptTokens, now)
			st.sentNs = now.UnixNano()
			st.inFlight = float64(n)
		}
		// Its decode is ahead, after the prefill queued there: a prompt
		// placed after it stalls it as much as those decoding now.
		r.noteHeadroom(st, now)
	}
	return Lease{r: r, done: done, st: st}, nil
}

// Progress takes back n tokens of the lease's outstanding work (the
// prefill when the first token arrives, then one per generated token).
func (l Lease) Progress(n int64) {
	if l.r == nil || n <= 0 {
		return
	}
	n = min(n, l.st.remaining)
	l.st.remaining -= n
	l.r.tel.outstanding.Add(-n)
}

// Alive records that the replica just delivered output (a token reached
// the router): passive evidence of life the health checker weighs against
// probe timeouts. It reads the replica's clock, so the stamp and
// AliveWithin always agree on what now is.
func (l Lease) Alive() {
	if l.r != nil {
		l.r.markAlive(l.r.now())
	}
}

// AliveAt is Alive for a caller that has read the clock already, as a
// stream has for each of its events: the replica is stamped (on its own
// clock, as Alive does) at most once per half aliveResolution of the
// caller's now, so that an event costs no clock read more.
func (l Lease) AliveAt(now time.Time) {
	if l.r == nil {
		return
	}
	n := now.UnixNano()
	if l.st.aliveNs != 0 && n-l.st.aliveNs < int64(aliveResolution/2) && n >= l.st.aliveNs {
		return
	}
	l.st.aliveNs = n
	l.r.markAlive(l.r.now())
}

// PrefillDone marks the end of the request's prefill (its first token):
// its prompt leaves the replica's queued prefill, and the time since it was
// sent teaches the replica's TTFT fit. Further calls do nothing.
func (l Lease) PrefillDone() {
	if l.r == nil {
		return
	}
	if l.st.long {
		l.st.long = false
		l.r.longPrefills.Add(-1)
	}
	l.st.made.CompareAndSwap(0, 1) // the first token: it decodes from now
	if l.st.prefilling {
		l.st.prefilling = false
		l.r.pred.prefillQueued.Add(-l.st.prompt)
		l.st.decodeFrom = l.r.pred.promptSent.Load()
		ttft := time.Duration(l.r.now().UnixNano() - l.st.sentNs)
		l.r.learnTTFT(l.st.x, l.st.waitX, ttft.Seconds())
	}
}

// PredictedTTFT is the TTFT the replica's predictor expected for the
// request when it was placed (0 when its prompt size was not given): what
// the router's records compare with the measured TTFT.
func (l Lease) PredictedTTFT() time.Duration {
	if l.st == nil {
		return 0
	}
	return time.Duration(l.st.predTTFT * float64(time.Second))
}

// Done ends the lease. err nil is a success; an error wrapping
// ErrNotReplicaFault is ignored by the breaker; any other error counts as a
// failure of the replica.
func (l Lease) Done(err error) {
	if l.r == nil {
		return
	}
	if l.st.prefilling { // ended before its first token: nothing to learn
		l.st.prefilling = false
		l.r.pred.prefillQueued.Add(-l.st.prompt)
	}
	l.PrefillDone()
	l.r.inFlight.Add(-1)
	if g := l.r.group.Load(); g != nil {
		g.Add(-1)
	}
	l.r.tel.outstanding.Add(-l.st.remaining)
	l.st.remaining = 0
	l.r.kvReserved.Add(-l.st.kv)
	if l.st.kv > 0 {
		l.r.kv.remove(l.st)
	}
	l.st.kv = 0
	if l.st.adapter != 0 {
		l.r.lora.release(l.st.adapter, l.r.now().UnixNano())
		l.st.adapter = 0
	}
	if err == nil {
		l.r.markAlive(l.r.now())
	}
	l.done(err)
}

// Replica returns the leased replica (nil for a zero Lease).
func (l Lease) Replica() *Replica { return l.r }
