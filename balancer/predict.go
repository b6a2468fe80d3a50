package balancer

import (
	"math"
	"sync/atomic"
	"time"
)

// predictor is what a replica learns about its own latency, online, from
// the router's measurements of the requests it sends there — no offline
// profile — so that a picker can predict a new request's TTFT and TPOT on
// each replica before choosing:
//
//   - TTFT ≈ a + b·(prefill tokens queued ahead of it on the replica + its
//     own prompt). vLLM schedules prefills first come, first served, so a
//     request's first token waits for every prompt token sent there before
//     it; b is the replica's inverse prefill rate (seconds per token, what a
//     half-speed or throttled replica shows as twice the slope), a the fixed
//     cost (a step, the network).
//   - TPOT ≈ (c + d·(requests in flight on the replica once it joins)) /
//     (1 − ρ): a decode step in the batch it would join, stretched by the
//     prefills that arrive while it decodes — vLLM runs a new request's
//     prefill in the steps the running ones decode in, so a replica whose
//     prefill is busy a fraction ρ of the time (the prompt tokens sent to
//     it per second × b) gives each of its decoding requests a token in a
//     step that long. ρ is what makes a half-speed replica, whose every
//     prefill stalls its batch twice as long, a poor place for a decode
//     while prompts keep arriving there, and a good one once they stop.
//     The step fit learns from measured TPOTs less that stretch.
//
// Both fits forget old samples (linFit), so a replica that slows down is
// re-learned within a few dozen requests. The zero value knows nothing:
// predictions fall back to the pool's other replicas, then to defaults.
type predictor struct {
	// prefillQueued is the prompt tokens of the router's requests on the
	// replica that have not produced a first token: the prefill work a new
	// request would queue behind.
	prefillQueued atomic.Int64
	// meanPrompt is an EWMA of the prompt tokens sent to the replica
	// (float64 bits), to size requests the engine reports that this router
	// did not send (other routers').
	meanPrompt atomic.Uint64
	ttft       linFit // x: tokens ahead + own prompt; y: seconds, sent → first token (less the engine-queue term)
	// waitPer is the TTFT each request waiting in the engine's queue ahead
	// adds (float64 bits, seconds): vLLM holds new requests there while
	// its KV cache is full, a wait the prefill queue does not show. An EWMA
	// of the TTFT beyond the prefill fit over the requests queued at send.
	waitPer atomic.Uint64
	tpot    stepFit // x: requests in flight at send, own included; y: seconds per decode step, less the prefills' stretch
	// lastSendNs and sendGap (float64 bits, seconds, an EWMA) time the
	// requests placed on the replica: with meanPrompt, the rate prompt
	// tokens arrive there (prefillLoad).
	lastSendNs atomic.Int64
	sendGap    atomic.Uint64
	// promptSent is every prompt token placed on the replica so far: the
	// prefill that ran while a request decoded is its growth over the
	// decode.
	promptSent atomic.Int64
	// itl is the liveITL EWMA (float64 bits, seconds), last fed at itlAtNs.
	itl     atomic.Uint64
	itlAtNs atomic.Int64
	// headroom is the least decode headroom (float64 bits, seconds) its
	// decoding requests reported, last lowered or reset at headroomAtNs
	// (headroom.go).
	headroom     atomic.Uint64
	headroomAtNs atomic.Int64
}

// DefaultPrefillSecondsPerToken is the prefill cost assumed for a replica
// before any replica of its pool has been measured (≈ 5,000 tokens/s, an
// 8B model on one mid-range GPU). It only orders replicas until the first
// response: the fit replaces it.
const DefaultPrefillSecondsPerToken = 1.0 / 5000

// promptAlpha weights a new prompt in the meanPrompt EWMA.
const promptAlpha = 0.05

// PredictorState is a replica's learned latency model, for /debug views
// and the bench report: TTFT ≈ TTFTFixed + TTFTPerToken·(queued + prompt),
// TPOT ≈ TPOTFixed + TPOTPerRequest·in-flight. Zero fields with Samples 0
// mean nothing is learned yet.
type PredictorState struct {
	PrefillQueuedTokens int64   `json:"prefill_queued_tokens"`
	TTFTFixedS          float64 `json:"ttft_fixed_s"`
	TTFTPerToken        float64 `json:"ttft_s_per_token"`
	TTFTSamples         int64   `json:"ttft_samples"`
	// PrefillTokensPerS is the replica's measured prefill speed: prompt
	// tokens (its own and those queued ahead) per second of TTFT over the
	// fit's samples — the capacity bench compares request shares with.
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s"`
	// EngineWaitPerRequestS is the TTFT each request already waiting in
	// the engine's queue adds (its KV cache full).
	EngineWaitPerRequestS float64 `json:"engine_wait_per_request_s"`
	TPOTFixedS            float64 `json:"tpot_fixed_s"`
	TPOTPerRequest        float64 `json:"tpot_s_per_request"`
	TPOTSamples           int64   `json:"tpot_samples"`
	// LiveITLS is the replica's inter-token latency as the router sees its
	// streams now (0: nothing streamed there in the last second).
	LiveITLS float64 `json:"live_itl_s"`
	// PrefillLoad is the predicted fraction of the replica's time spent
	// prefilling the prompts arriving there, what stretches its decodes.
	PrefillLoad float64 `json:"prefill_load"`
}

// Predictor returns the replica's learned latency model.
func (r *Replica) Predictor() PredictorState {
	s := PredictorState{PrefillQueuedTokens: r.pred.prefillQueued.Load()}
	s.TTFTFixedS, s.TTFTPerToken, _ = r.pred.ttft.coeffs()
	s.TPOTFixedS, s.TPOTPerRequest, _ = r.pred.tpot.coeffs()
	s.TTFTSamples, s.TPOTSamples = r.pred.ttft.n.Load(), r.pred.tpot.n.Load()
	s.PrefillTokensPerS = r.pred.ttft.rate()
	s.EngineWaitPerRequestS = r.waitPer()
	now := r.now()
	s.LiveITLS = r.liveITL(now)
	b := s.TTFTPerToken
	if b <= 0 {
		b = DefaultPrefillSecondsPerToken
	}
	s.PrefillLoad = r.prefillLoad(b, r.freshEngine(now), now)
	return s
}

// prefillAhead is the prefill work, in prompt tokens, a request sent at
// now would wait behind: the router's own requests still in prefill, plus
// — from a fresh engine snapshot — those the other routers are expected
// to have sent since the scrape (othersSince), sized at the replica's
// mean prompt, as the router's own sends since count. Not every request
// the engine holds that this router did not send: most of those are
// decoding, past their prefill, and the TTFT fit learns from x without
// them (startPrefill): with several routers, counting them at a mean
// prompt each added prefill that is not there to every replica's
// predicted TTFT, and the policy ranked replicas by the other routers'
// running requests (4 routers vs 1, 2 rounds each: P99 TTFT +16% with
// them, +5% without; bench/scripts/many-routers.sh). Those waiting still
// count, through engineQueued.
func (r *Replica) prefillAhead(e *EngineLoad, now time.Time) float64 {
	ahead := float64(max(r.pred.prefillQueued.Load(), 0))
	ahead += othersSince(e, now) * math.Float64frombits(r.pred.meanPrompt.Load())
	return ahead
}

// prefillWait is the time the router's own queued prefill on the replica
// takes at its learned rate (the default rate before it has one).
func (r *Replica) prefillWait() time.Duration {
	q := r.pred.prefillQueued.Load()
	if q <= 0 {
		return 0
	}
	_, b, ok := r.pred.ttft.coeffs()
	if !ok || b <= 0 {
		b = DefaultPrefillSecondsPerToken
	}
	return time.Duration(float64(q) * b * float64(time.Second))
}

// prior is what a pick assumes for replicas not yet measured: the mean of
// the measured candidates' fits (so a new replica is neither flooded nor
// starved), else the defaults.
type prior struct {
	ttftA, ttftB, tpotA, tpotB float64
	ttftLearned                bool // some candidate's prefill fit: ttftA, ttftB are measured, not the default
}

func priorOf(candidates []*Replica) prior {
	var p prior
	var nT, nP float64
	for _, c := range candidates {
		if a, b, ok := c.pred.ttft.coeffs(); ok {
			p.ttftA, p.ttftB, nT = p.ttftA+a, p.ttftB+b, nT+1
		}
		if a, b, ok := c.pred.tpot.coeffs(); ok {
			p.tpotA, p.tpotB, nP = p.tpotA+a, p.tpotB+b, nP+1
		}
	}
	if nT > 0 {
		p.ttftA, p.ttftB, p.ttftLearned = p.ttftA/nT, p.ttftB/nT, true
	} else {
		p.ttftB = DefaultPrefillSecondsPerToken
	}
	if nP > 0 {
		p.tpotA, p.tpotB = p.tpotA/nP, p.tpotB/nP
	}
	return p
}

// predict returns the replica's predicted TTFT and TPOT, in seconds, for a
// request of prompt tokens sent at now; e is the fresh engine snapshot or nil.
func (r *Replica) predict(prompt int, e *EngineLoad, now time.Time, p *prior) (ttft, tpot float64) {
	a, b, ok := r.pred.ttft.coeffs()
	if !ok || b <= 0 {
		a, b = p.ttftA, p.ttftB
	}
	ttft = a + b*(r.prefillAhead(e, now)+float64(max(prompt, 0))) + r.waitPer()*r.engineQueued(e, 0, now)
	c, d, ok := r.pred.tpot.coeffs()
	if !ok {
		c, d = p.tpotA, p.tpotB
	}
	tpot = max((c+d*float64(r.inFlight.Load()+1))/(1-r.prefillLoad(b, e, now)), r.liveITL(now))
	return ttft, tpot
}

// tpotUnstretched is the replica's predicted TPOT without the stretch of
// the prompts still to arrive there (prefillLoad): the step of its batch
// with one more request, or what the router sees it stream now when that
// is longer.
func (r *Replica) tpotUnstretched(now time.Time, p *prior) float64 {
	c, d, ok := r.pred.tpot.coeffs()
	if !ok {
		c, d = p.tpotA, p.tpotB
	}
	return max(c+d*float64(r.inFlight.Load()+1), r.liveITL(now))
}

// liveITL is the replica's inter-token latency as the router sees it
// stream now — an EWMA over every output chunk of every request decoding
// there — or 0 when none has streamed for liveITLFresh. It is the step a
// request joining the batch now would first decode in, prefill stalls
// included, measured rather than modelled: it shows a replica whose
// arriving prompts stretch its decodes at once, not when the stretched
// requests end tens of seconds later.
func (r *Replica) liveITL(now time.Time) float64 {
	at := r.pred.itlAtNs.Load()
	if at == 0 || now.UnixNano()-at > int64(liveITLFresh) {
		return 0
	}
	return math.Float64frombits(r.pred.itl.Load())
}

// liveITLFresh is how long after its last output chunk a replica's
// liveITL still counts: a batch that stopped streaming has drained.
const liveITLFresh = time.Second

// itlWindow is about how much of the replica's streaming liveITL
// averages. Each gap weighs as one of the gaps its streams yield in that
// time — in flight over the current ITL, per second — so twenty requests
// decoding average a second of steps, as two do. A fixed weight per gap
// (0.05) spanned a second with a handful of streams but a single step
// with twenty: one prefill stall then read as the replica's ITL, and on
// the conversation trace at 85% load the three full-speed replicas, each
// stalled at 134–184 ms the same instant, looked slower than the
// half-speed one (78 ms), which took three 400-token generations; each
// decoded there for over 30 s where the others streamed at ~50 ms, and
// the run ended 9 s late (2 of 8 runs ended 8–10 s late, 0 of 9 since).
// What it costs there: the half-speed replica, streaming a handful,
// reads its own prefill stalls less sharply, and 7.3 requests a run
// missed the TPOT objective on it, against 3.9 before; the mean goodput
// stayed where it was (2.83 against 2.81). Those misses were short
// outputs beside a long prompt's prefill, which the decode headroom now
// keeps off (headroom.go: 0–3 a run since).
const itlWindow = time.Second

// observeITL adds one inter-token gap seen at now to liveITL.
func (r *Replica) observeITL(gap time.Duration, now time.Time) {
	if gap <= 0 {
		return
	}
	g := gap.Seconds()
	fresh := now.UnixNano()-r.pred.itlAtNs.Load() <= int64(liveITLFresh)
	n := float64(max(r.inFlight.Load(), 1))
	for {
		old := r.pred.itl.Load()
		next := g
		if cur := math.Float64frombits(old); cur > 0 && fresh {
			next = cur + min(cur/(n*itlWindow.Seconds()), 1)*(g-cur)
		}
		if r.pred.itl.CompareAndSwap(old, math.Float64bits(next)) {
			break
		}
	}
	r.pred.itlAtNs.Store(now.UnixNano())
}

// maxPrefillLoad caps prefillLoad: past it a replica's decodes are
// predicted at ten times their step, far over any objective anyway.
const maxPrefillLoad = 0.9

// prefillLoad is ρ, the fraction of the replica's time its prefill is
// busy with the prompts arriving there: their token rate times b, its
// seconds per prefill token. The rate is this router's (the mean prompt
// over the mean gap between the requests it placed there, no shorter than
// the time since the last one, so a replica it stopped using is not
// judged by its busy past) plus, from e (the fresh engine snapshot, or
// nil), the other routers' requests at the same mean prompt.
func (r *Replica) prefillLoad(b float64, e *EngineLoad, now time.Time) float64 {
	if !(b > 0) {
		return 0
	}
	mean := math.Float64frombits(r.pred.meanPrompt.Load())
	var perS float64
	if last, gap := r.pred.lastSendNs.Load(), math.Float64frombits(r.pred.sendGap.Load()); last != 0 && gap > 0 {
		perS = 1 / max(gap, float64(now.UnixNano()-last)/1e9)
	}
	if e != nil {
		perS += max(e.OthersPerS, 0)
	}
	return min(perS*mean*b, maxPrefillLoad)
}

// learnTPOT teaches the step fit one request's decode: tokens after the
// first over d seconds, joined at inFlight requests in flight, while
// promptDuring prompt tokens were placed on the replica. Their prefill, at
// the TTFT fit's rate, comes out of d: the step fit learns the batch,
// prefillLoad predicts the stretch. At most half of d goes, so a rate
// learned too slow cannot make every step look free.
func (r *Replica) learnTPOT(inFlight float64, tokens int, d, promptDuring float64) {
	if tokens < 2 || d <= 0 || inFlight <= 0 {
		return
	}
	_, b, ok := r.pred.ttft.coeffs()
	if !ok || b <= 0 {
		b = DefaultPrefillSecondsPerToken
	}
	stretch := min(max(promptDuring, 0)*b, d/2)
	r.pred.tpot.observe(inFlight, (d-stretch)/float64(tokens-1))
}

// tpotSlope is the TPOT each request joining the replica's batch adds, in
// seconds: its fit's slope (the pool's prior before it has one), never
// negative.
func (r *Replica) tpotSlope(p *prior) float64 {
	_, d, ok := r.pred.tpot.coeffs()
	if !ok {
		d = p.tpotB
	}
	return max(d, 0)
}

// PredictTTFT is the replica's predicted time to first token for a request
// of prompt tokens sent now, from what it has learned alone (the pool's
// prior is a picker's business): what a lease records to compare with the
// measured TTFT.
func (r *Replica) PredictTTFT(prompt int) time.Duration {
	p := prior{ttftB: DefaultPrefillSecondsPerToken}
	ttft, _ := r.predict(prompt, nil, time.Time{}, &p)
	return time.Duration(ttft * float64(time.Second))
}

// waitAlpha weights a new sample in the waitPer EWMA.
const waitAlpha = 0.1

func (r *Replica) waitPer() float64 { return math.Float64frombits(r.pred.waitPer.Load()) }

// engineQueued is how many requests a new one would find ahead of it in
// the engine's waiting queue: none while the engine reported none waiting
// (e nil: no fresh report), else those it reported plus what the router
// sent since and what the other routers are expected to have sent since
// (othersSince) at now — they queued behind them — less self (a request
// already counted in flight).
func (r *Replica) engineQueued(e *EngineLoad, self int64, now time.Time) float64 {
	if e == nil || e.Waiting <= 0 {
		return 0
	}
	sent := r.inFlight.Load() - self - r.tel.inFlightAtScrape.Load()
	return float64(int64(e.Waiting)+max(sent, 0)) + othersSince(e, now)
}

// freshEngine is the engine snapshot when it is at most
// DefaultStaleAfter old at now (the replica's clock), else nil.
func (r *Replica) freshEngine(now time.Time) *EngineLoad {
	e := r.tel.engine.Load()
	if e == nil || now.Sub(e.At) > DefaultStaleAfter {
		return nil
	}
	return e
}

// learnTTFT teaches the TTFT model one request's measured TTFT y: the
// engine-queue term learns what the prefill fit does not explain for a
// request that found others waiting, and the prefill fit learns the rest.
func (r *Replica) learnTTFT(x, waitX, y float64) {
	a, b, ok := r.pred.ttft.coeffs()
	w := r.waitPer()
	if waitX >= 1 && ok {
		sample := max(y-(a+b*x), 0) / waitX
		next := sample
		if w > 0 {
			next = w + waitAlpha*(sample-w)
		}
		r.pred.waitPer.Store(math.Float64bits(next))
	}
	r.pred.ttft.observe(x, max(y-w*waitX, 0))
}

// startPrefill counts a request's prompt as queued prefill work, sent at
// now (the replica's clock), and returns the fit's x for it (the tokens ahead plus its own), the requests
// it finds in the engine's waiting queue, and its predicted TTFT.
func (r *Replica) startPrefill(prompt int64, now time.Time) (x, waitX, predicted float64) {
	prompt = max(prompt, 0)
	ahead := r.pred.prefillQueued.Add(prompt) - prompt
	x = float64(max(ahead, 0) + prompt)
	r.pred.promptSent.Add(prompt)
	r.noteSend(now.UnixNano())
	waitX = r.engineQueued(r.freshEngine(now), 1, now)
	a, b, ok := r.pred.ttft.coeffs()
	if !ok {
		a, b = 0, DefaultPrefillSecondsPerToken
	}
	for {
		old := r.pred.meanPrompt.Load()
		cur := math.Float64frombits(old)
		next := float64(prompt)
		if cur > 0 {
			next = cur + promptAlpha*(next-cur)
		}
		if r.pred.meanPrompt.CompareAndSwap(old, math.Float64bits(next)) {
			break
		}
	}
	return x, waitX, a + b*x + r.waitPer()*waitX
}

// gapAlpha weights a new gap in the sendGap EWMA.
const gapAlpha = 0.1

// noteSend records a request placed on the replica at nowNs (its clock).
func (r *Replica) noteSend(nowNs int64) {
	last := r.pred.lastSendNs.Swap(nowNs)
	if last == 0 || nowNs <= last {
		return
	}
	g := float64(nowNs-last) / 1e9
	for {
		old := r.pred.sendGap.Load()
		next := g
		if cur := math.Float64frombits(old); cur > 0 {
			next = cur + gapAlpha*(g-cur)
		}
		if r.pred.sendGap.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// ObserveDecode teaches the replica's decode speed (Replica.ObserveDecode)
// and its TPOT model (learnTPOT): the requests in flight the request
// joined, and the prompts placed on the replica while it decoded.
func (l Lease) ObserveDecode(tokens int, d time.Duration) {
	if l.r == nil {
		return
	}
	l.r.ObserveDecode(tokens, d)
	if !l.st.prefilling && l.st.inFlight > 0 {
		during := float64(l.r.pred.promptSent.Load()-l.st.decodeFrom) + l.r.othersPrompt(d.Seconds(), l.r.now())
		l.r.learnTPOT(l.st.inFlight, tokens, d.Seconds(), during)
	}
}

// othersPrompt is the prompt tokens the other routers are expected to have
// placed on the replica over the last d seconds: their arrival rate there
// (EngineLoad.OthersPerS, from the fresh snapshot at now) at the mean
// prompt, as prefillLoad counts them; 0 with one router. A decode there
// was stretched by their prefills as by this router's, and the step fit
// must not learn that stretch as the batch's step: prefillLoad predicts
// it from the same rate, and counted twice it made every busy replica
// look over the TPOT objective to a router sharing the fleet with others.
func (r *Replica) othersPrompt(d float64, now time.Time) float64 {
	e := r.freshEngine(now)
	if e == nil || !(e.OthersPerS > 0) || !(d > 0) {
		return 0
	}
	return e.OthersPerS * d * math.Float64frombits(r.pred.meanPrompt.Load())
}

// ObserveGap records the time between two output chunks of the request,
// seen at now, for the replica's live inter-token latency (liveITL) and
// its decode headroom (headroom.go).
func (l Lease) ObserveGap(gap time.Duration, now time.Time) {
	if l.r == nil {
		return
	}
	l.r.observeITL(gap, now)
	l.st.made.Add(1)
	if l.st.output > 1 {
		l.st.gaps++
		l.st.decodeS += gap.Seconds()
		l.r.noteHeadroom(l.st, now)
	}
}

// Predict is the replica's predicted TTFT and TPOT for a request of
// prompt tokens sent at now, from what it has learned and its engine's
// fresh snapshot (the pool's prior is a picker's business): what a
// trace of the pick records beside what came of it.
func (r *Replica) Predict(prompt int, now time.Time) (ttft, tpot time.Duration) {
	p := prior{ttftB: DefaultPrefillSecondsPerToken}
	t, d := r.predict(prompt, r.freshEngine(now), now, &p)
	return time.Duration(t * float64(time.Second)), time.Duration(d * float64(time.Second))
}
