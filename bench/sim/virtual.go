package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Workload is client load in the shape of `vllm bench serve` with the random
// dataset: how many requests, how they arrive, and how long they are.
type Workload struct {
	NumPrompts     int            // requests to send (--num-prompts)
	RequestRate    float64        // mean arrivals per second, Poisson (--request-rate); 0 = all at once (inf)
	MaxConcurrency int            // client-side cap on requests in flight (--max-concurrency); 0 = none
	Classes        []RequestClass // request shapes, drawn by weight; at least one
	// IgnoreEOS makes every request produce exactly its OutputLen tokens
	// (--ignore-eos); otherwise lengths come from the profile's output
	// distribution, capped by OutputLen.
	IgnoreEOS bool
	Seed      uint64 // --seed
	// Warmup is how many of the first requests sent are left out of the
	// latency statistics (they see an empty engine fill up); they still
	// count for throughput.
	Warmup int
	// Adapters, when > 0, makes every request name one of that many LoRA
	// adapters (the profile needs enable_lora), drawn by a Zipf law of
	// exponent AdapterZipf over their rank (0 = uniform). The adapters
	// are preloaded as vLLM's --lora-modules are, in rank order.
	Adapters    int
	AdapterZipf float64
	// SLOTTFT and SLOTPOT judge goodput as vllm bench's --goodput does:
	// a request is good when its TTFT and its TPOT are within them (0 =
	// not judged). With neither, Report.RequestGoodput is 0.
	SLOTTFT, SLOTPOT time.Duration
}

// RequestClass is one request shape in a Workload.
type RequestClass struct {
	Weight     float64 // relative frequency; 0 counts as 1
	InputLen   int     // prompt tokens (--random-input-len)
	OutputLen  int     // max_tokens (--random-output-len)
	RangeRatio float64 // lengths uniform in [L·(1−r), L·(1+r)] (--random-range-ratio)
}

// Dist summarises a latency distribution.
type Dist struct {
	Mean, Median, P90, P95, P99 time.Duration
	N                           int
}

// Report is what Simulate measured, with vllm bench's definitions: TTFT from
// request sent to first token, TPOT = (e2e − TTFT)/(tokens − 1) per request
// with more than one token, ITL = every gap between tokens, pooled.
type Report struct {
	Completed            int
	Duration             time.Duration // first request sent → last token
	InputTokens          int
	OutputTokens         int
	RequestThroughput    float64 // requests/s
	RequestGoodput       float64 // requests/s meeting Workload's SLOs (latency-measured requests only)
	OutputThroughput     float64 // tokens/s
	TotalTokenThroughput float64 // (input+output) tokens/s
	TTFT, TPOT, ITL, E2E Dist
	PeakConcurrency      int     // most requests in flight at the client
	MeanBatch            float64 // time-weighted sequences per step while busy
	MeanKVUsage          float64 // time-weighted kv_cache_usage_perc while busy
	PeakKVUsage          float64
	Preemptions          int
	PrefixCacheHitRate   float64 // hits / queries, tokens
	// LoRASwapsCPU and LoRASwapsDisk count adapters swapped into GPU
	// slots from the CPU cache and from disk; LoRASwapTime is the engine
	// time they took.
	LoRASwapsCPU, LoRASwapsDisk int
	LoRASwapTime                time.Duration
	// KVTransfers and KVTransferTime are a split fleet's KV reads and how
	// long each took (SimulateFleet); zero otherwise.
	KVTransfers    int
	KVTransferTime Dist
}

// Simulate runs a workload against one replica of profile p in virtual time:
// no sleeping, no goroutines, the same engine as Replica. It is deterministic
// for a given seed.
func Simulate(p Profile, w Workload) (Report, error) {
	if w.NumPrompts <= 0 || len(w.Classes) == 0 {
		return Report{}, errors.New("sim: workload needs NumPrompts > 0 and at least one class")
	}
	d, err := p.derive()
	if err != nil {
		return Report{}, err
	}
	if w.Adapters < 0 || w.AdapterZipf < 0 || (w.Adapters > 0 && !p.Engine.EnableLoRA) {
		return Report{}, errors.New("sim: workload adapters need a profile with enable_lora, and must be >= 0")
	}
	reg := prometheus.NewRegistry()
	m := newEngineMetrics(reg, metricsOptions{modelName: p.Model.Name, maxModelLen: d.maxModelLen, maxLoRAs: d.lora.maxLoRAs})
	eng, err := newEngine(p, m)
	if err != nil {
		return Report{}, err
	}
	v := &vdriver{eng: eng, p: p, w: w, rng: rand.New(rand.NewPCG(w.Seed, 0x5EED))}
	for i := range w.Adapters {
		a := &loraAdapter{id: i + 1, name: fmt.Sprintf("lora-%d", i), path: fmt.Sprintf("/adapters/%d", i)}
		v.adapters = append(v.adapters, a)
		eng.lora.preload(a)
	}
	if err := v.makeRequests(d.maxModelLen); err != nil {
		return Report{}, err
	}
	v.run()
	return v.report(), nil
}

// vdriver is the discrete-event loop of Simulate.
type vdriver struct {
	eng *engine
	p   Profile
	w   Workload
	rng *rand.Rand

	reqs     []*vreq
	adapters []*loraAdapter // by popularity rank
	next     int            // next request to arrive
	queue    []*vreq
	frontend vheap
	inflight int
	now      time.Time

	peak     int
	busy     time.Duration
	batchSum float64
	kvSum    float64
	kvPeak   float64
	itl      []time.Duration
	done     int
}

// vreq is one simulated request and its client-side measurements.
type vreq struct {
	d        *vdriver
	s        *seq
	arrive   time.Time // scheduled arrival at the client
	sent     time.Time
	first    time.Time
	last     time.Time
	tokens   int
	finished bool
	warmup   bool // excluded from latency statistics
}

func (r *vreq) emit(n int, reason finishReason, now time.Time) {
	if n > 0 {
		if r.tokens == 0 {
			r.first = now
		} else if !r.warmup {
			r.d.itl = append(r.d.itl, now.Sub(r.last))
		}
		r.tokens += n
		r.last = now
	}
	if reason != reasonNone {
		r.finished = true
		r.d.inflight--
		r.d.done++
	}
}

func (v *vdriver) makeRequests(maxModelLen int) error {
	var total float64
	for _, c := range v.w.Classes {
		total += classWeight(c)
	}
	t := time.Unix(0, 0)
	for i := range v.w.NumPrompts {
		x := v.rng.Float64() * total
		c := v.w.Classes[len(v.w.Classes)-1]
		for _, cc := range v.w.Classes {
			if x < classWeight(cc) {
				c = cc
				break
			}
			x -= classWeight(cc)
		}
		in, out := v.length(c.InputLen, c.RangeRatio), v.length(c.OutputLen, c.RangeRatio)
		if in+out > maxModelLen {
			return fmt.Errorf("sim: workload request of %d+%d tokens exceeds max_model_len %d", in, out, maxModelLen)
		}
		target := out
		if !v.w.IgnoreEOS {
			target = min(out, drawLength(v.rng, v.p.Model.OutputLen))
		}
		if v.w.RequestRate > 0 && i > 0 {
			t = t.Add(time.Duration(v.rng.ExpFloat64() / v.w.RequestRate * 1e9))
		}
		r := &vreq{d: v, arrive: t, warmup: i < v.w.Warmup}
		r.s = &seq{id: uint64(i + 1), prompt: in, target: target, maxTokens: out, salt: v.rng.Uint64(), sink: r}
		v.reqs = append(v.reqs, r)
	}
	if len(v.adapters) > 0 {
		// A stream of its own, so that the requests' shapes do not change
		// with the adapters.
		pick := zipfPicker(len(v.adapters), v.w.AdapterZipf)
		arng := rand.New(rand.NewPCG(v.w.Seed, 0x10AA))
		for _, r := range v.reqs {
			r.s.lora = v.adapters[pick(arng.Float64())]
		}
	}
	// Like vllm bench, stretch the arrivals so the last one is at
	// NumPrompts/RequestRate and the offered rate is exact.
	if n := len(v.reqs); v.w.RequestRate > 0 && n > 1 {
		last := v.reqs[n-1].arrive.Sub(time.Unix(0, 0))
		want := time.Duration(float64(n) / v.w.RequestRate * 1e9)
		for _, r := range v.reqs {
			r.arrive = time.Unix(0, 0).Add(time.Duration(float64(r.arrive.Sub(time.Unix(0, 0))) * float64(want) / float64(last)))
		}
	}
	return nil
}

func classWeight(c RequestClass) float64 {
	if c.Weight <= 0 {
		return 1
	}
	return c.Weight
}

func (v *vdriver) length(n int, ratio float64) int {
	if ratio <= 0 || n <= 1 {
		return max(n, 1)
	}
	lo, hi := int(float64(n)*(1-ratio)), int(float64(n)*(1+ratio))
	return max(1, lo+v.rng.IntN(hi-lo+1))
}

// drawLength samples a log-normal length (at least 1).
func drawLength(rng *rand.Rand, d LengthDist) int {
	if d.Sigma == 0 {
		return max(d.Median, 1)
	}
	return max(1, int(math.Round(float64(d.Median)*math.Exp(d.Sigma*rng.NormFloat64()))))
}

func (v *vdriver) apiDelay(prompt int) time.Duration {
	return v.p.Overheads.API + time.Duration(prompt)*v.p.Overheads.APIPerPromptToken
}

func (v *vdriver) run() {
	v.now = time.Unix(0, 0)
	var stepEnd time.Time
	stepping := false
	for v.done < len(v.reqs) {
		if !stepping {
			if d := v.eng.schedule(v.now); d > 0 {
				stepping, stepEnd = true, v.now.Add(d)
				v.busy += d
				v.batchSum += float64(v.eng.load.seqs) * d.Seconds()
				kv := v.eng.kv.usage()
				v.kvSum += kv * d.Seconds()
				v.kvPeak = max(v.kvPeak, kv)
			}
		}
		next := time.Time{}
		earliest := func(t time.Time) {
			if next.IsZero() || t.Before(next) {
				next = t
			}
		}
		if stepping {
			earliest(stepEnd)
		}
		if v.next < len(v.reqs) {
			earliest(v.reqs[v.next].arrive)
		}
		if len(v.frontend) > 0 {
			earliest(v.frontend[0].ready)
		}
		if next.IsZero() {
			break // nothing can happen: should not occur
		}
		v.now = next
		for v.next < len(v.reqs) && !v.reqs[v.next].arrive.After(v.now) {
			v.queue = append(v.queue, v.reqs[v.next])
			v.next++
		}
		v.dispatch()
		for len(v.frontend) > 0 && !v.frontend[0].ready.After(v.now) {
			f := heap.Pop(&v.frontend).(vready)
			f.r.s.arrival = f.r.sent
			v.eng.add(f.r.s, f.ready)
		}
		if stepping && !stepEnd.After(v.now) {
			v.eng.complete(stepEnd)
			stepping = false
			v.dispatch()
		}
	}
}

// dispatch sends queued requests while the client has slots.
func (v *vdriver) dispatch() {
	for len(v.queue) > 0 && (v.w.MaxConcurrency <= 0 || v.inflight < v.w.MaxConcurrency) {
		r := v.queue[0]
		v.queue = v.queue[1:]
		r.sent = v.now
		v.inflight++
		v.peak = max(v.peak, v.inflight)
		heap.Push(&v.frontend, vready{ready: v.now.Add(v.apiDelay(r.s.prompt)), r: r, seq: r.s.id})
	}
}

func (v *vdriver) report() Report {
	var rep Report
	var ttft, tpot, e2e []time.Duration
	good := 0
	var start, end time.Time
	for i, r := range v.reqs {
		if i == 0 || r.sent.Before(start) {
			start = r.sent
		}
		if r.last.After(end) {
			end = r.last
		}
		if r.tokens == 0 {
			continue
		}
		rep.Completed++
		rep.InputTokens += r.s.prompt
		rep.OutputTokens += r.tokens
		if r.warmup {
			continue
		}
		ttft = append(ttft, r.first.Sub(r.sent))
		e2e = append(e2e, r.last.Sub(r.sent))
		var tp time.Duration
		if r.tokens > 1 {
			tp = r.last.Sub(r.first) / time.Duration(r.tokens-1)
			tpot = append(tpot, tp)
		}
		w := v.w
		if (w.SLOTTFT > 0 || w.SLOTPOT > 0) && (w.SLOTTFT == 0 || ttft[len(ttft)-1] <= w.SLOTTFT) &&
			(w.SLOTPOT == 0 || tp <= w.SLOTPOT) {
			good++
		}
	}
	rep.Duration = end.Sub(start)
	if sec := rep.Duration.Seconds(); sec > 0 {
		rep.RequestThroughput = float64(rep.Completed) / sec
		rep.RequestGoodput = float64(good) / sec
		rep.OutputThroughput = float64(rep.OutputTokens) / sec
		rep.TotalTokenThroughput = float64(rep.InputTokens+rep.OutputTokens) / sec
	}
	rep.TTFT, rep.TPOT, rep.ITL, rep.E2E = summarize(ttft), summarize(tpot), summarize(v.itl), summarize(e2e)
	rep.PeakConcurrency = v.peak
	if b := v.busy.Seconds(); b > 0 {
		rep.MeanBatch = v.batchSum / b
		rep.MeanKVUsage = v.kvSum / b
	}
	rep.PeakKVUsage = v.kvPeak
	rep.Preemptions = v.eng.preemptions
	if le := v.eng.lora; le != nil {
		rep.LoRASwapsCPU, rep.LoRASwapsDisk = le.swaps[swapFromCPU], le.swaps[swapFromDisk]
		rep.LoRASwapTime = le.swapTime[swapFromCPU] + le.swapTime[swapFromDisk]
	}
	if v.eng.prefixQueries > 0 {
		rep.PrefixCacheHitRate = float64(v.eng.prefixHits) / float64(v.eng.prefixQueries)
	}
	return rep
}

func summarize(xs []time.Duration) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum time.Duration
	for _, x := range s {
		sum += x
	}
	return Dist{Mean: sum / time.Duration(len(s)), Median: quantile(s, 0.5), P90: quantile(s, 0.9),
		P95: quantile(s, 0.95), P99: quantile(s, 0.99), N: len(s)}
}

// quantile interpolates linearly like numpy.percentile; s is sorted.
func quantile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i >= len(s)-1 {
		return s[len(s)-1]
	}
	f := pos - float64(i)
	return s[i] + time.Duration(f*float64(s[i+1]-s[i]))
}

// vready is a request leaving the frontend for the engine.
type vready struct {
	ready time.Time
	seq   uint64 // tie-break: FIFO
	r     *vreq
}

type vheap []vready

func (h vheap) Len() int { return len(h) }
func (h vheap) Less(i, j int) bool {
	if !h[i].ready.Equal(h[j].ready) {
		return h[i].ready.Before(h[j].ready)
	}
	return h[i].seq < h[j].seq
}
func (h vheap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *vheap) Push(x any)   { *h = append(*h, x.(vready)) }
func (h *vheap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// zipfPicker maps a uniform draw in [0, 1) to a rank in [0, n), rank k
// with weight 1/(k+1)^s (s = 0: uniform).
func zipfPicker(n int, s float64) func(u float64) int {
	cum := make([]float64, n)
	total := 0.0
	for k := range n {
		total += math.Pow(float64(k+1), -s)
		cum[k] = total
	}
	return func(u float64) int {
		i, _ := slices.BinarySearch(cum, u*total)
		return min(i, n-1)
	}
}
