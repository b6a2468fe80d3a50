package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/internal/openai"
	"github.com/valyala/fasthttp"
)

// Prefill/decode disaggregation (issue 54): a long prompt is computed on a
// prefill replica and its generation streamed by a decode replica, which
// reads the KV cache from the first — the protocol vLLM's NixlConnector
// and its disaggregated proxy define
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py; the
// simulator's bench/sim/kvtransfer.go restates it):
//
//  1. prefill: the request to a prefill replica with max_tokens 1
//     (max_completion_tokens 1 when given), stream false, no
//     stream_options, min_tokens, min_completion_tokens, and
//     kv_transfer_params {"do_remote_decode": true, "do_remote_prefill":
//     false, "remote_engine_id": null, …}; its answer carries the
//     kv_transfer_params the decode replica reads the blocks with.
//  2. decode: the client's request (as planned: clamped, usage asked) with
//     those kv_transfer_params verbatim, to a replica that takes
//     do_remote_prefill (Split.Decode), relayed as any answer is.
//
// Both are steps of the one flow (flow.go): place decides to split
// (splitPlace), the prefill step has its own admission (actPrefillAdmit)
// and attempts (actPrefill, prefilled), then the decode step is steps 4–6
// as for any request. A prefill that can't be had — no prefill replica,
// every try failed, an answer without kv_transfer_params — serves the
// request colocated, as if it had never been split; a decode replica
// whose read fails computes the prompt itself (kv_load_failure_policy
// recompute) or fails the request (fail), which the client sees as any
// engine's error. Only the goroutine path splits: a request loop hands a
// split pool's requests off by their head (reqloop_exchange_linux.go).

// DefaultSplitMinPromptTokens is Split.MinPromptTokens's default: below
// it a prompt's prefill is short enough (about a quarter of a second on an
// H100 for a 9B model) that interleaving it with decodes costs them less
// than a second request and a KV transfer cost it.
const DefaultSplitMinPromptTokens = 4096

// DefaultSplitPrefillsPerReplica is Split.PrefillsPerReplica's default:
// one prefill computing and one queued behind it, so that a replica never
// waits between two, and the rest wait at the router for whichever
// replica frees first.
const DefaultSplitPrefillsPerReplica = 2

// Split makes a pool's long prompts two-step (Route.Split); nil serves
// every request colocated. Build it with NewSplit.
type Split struct {
	// Prefill are the replicas that prefill for others (vLLM kv_role
	// kv_producer), Decode those that take a prompt another replica
	// computed (kv_consumer, kv_both): a replica not in Decode is never
	// sent do_remote_prefill. All are replicas of the route's pool, which
	// serves requests that are not split on any of its replicas.
	Prefill, Decode []*balancer.Replica
	// Picker is the prefill role's policy. Required (NewSplit).
	Picker balancer.Picker
	// Admission queues the prefill step at the router while every prefill
	// replica has PrefillsPerReplica prefills (Admissible is its
	// capacity); nil admits every prefill at once.
	Admission *admission.Controller
	// MinPromptTokens: a prompt of fewer tokens (the router's estimate) is
	// served colocated. 0 means DefaultSplitMinPromptTokens.
	MinPromptTokens int
	// PrefillsPerReplica bounds the router's prefills in flight on one
	// prefill replica under Admission. 0 means
	// DefaultSplitPrefillsPerReplica.
	PrefillsPerReplica int

	// Now is the clock Admissible judges availability by; nil means
	// time.Now.
	Now func() time.Time

	inFlight []atomic.Int64 // the router's prefills on Prefill[i]
}

// NewSplit is a Split of a pool's prefill and decode replicas, the prefill
// ones picked by pk; the other fields are set by the caller before the
// route is served.
func NewSplit(prefill, decode []*balancer.Replica, pk balancer.Picker) *Split {
	return &Split{Prefill: prefill, Decode: decode, Picker: pk, inFlight: make([]atomic.Int64, len(prefill))}
}

// Admissible is the prefill step's capacity (admission.Capacity): some
// available prefill replica has fewer than PrefillsPerReplica of the
// router's prefills.
func (sp *Split) Admissible(admission.Cost) bool {
	limit := int64(sp.perReplica())
	now := time.Now
	if sp.Now != nil {
		now = sp.Now
	}
	at := now()
	for i, r := range sp.Prefill {
		if r.Available(at) && sp.inFlight[i].Load() < limit {
			return true
		}
	}
	return false
}

// perReplica is PrefillsPerReplica, or its default.
func (sp *Split) perReplica() int {
	if sp.PrefillsPerReplica > 0 {
		return sp.PrefillsPerReplica
	}
	return DefaultSplitPrefillsPerReplica
}

// AdmissionConfig is c for the prefill step's controller: at most
// PrefillsPerReplica prefills per prefill replica admitted at once.
// Admissible alone can't bound that: two requests admitted at the same
// moment both see a replica's last free place, since the place is taken
// only once a prefill replica is picked; the controller counts what it
// admitted under its own lock.
func (sp *Split) AdmissionConfig(c admission.Config) admission.Config {
	if n := sp.perReplica() * len(sp.Prefill); c.MaxInFlight == 0 || n < c.MaxInFlight {
		c.MaxInFlight = n
	}
	return c
}

// pays reports whether splitting x, to be picked as pick, pays: a
// generation long enough and a prompt at least MinPromptTokens, with a
// prefill and a decode replica up — and no decode replica holding so
// much of the prompt in its prefix cache that what it would have to
// compute is under MinPromptTokens: served there colocated, the request
// prefills little, and a split would move every block of the prompt
// across for nothing.
func (sp *Split) pays(x *exchange, pick *balancer.Request, now time.Time) bool {
	min := sp.MinPromptTokens
	if min <= 0 {
		min = DefaultSplitMinPromptTokens
	}
	if x.ep == openai.Embeddings || x.cost.PromptTokens < min || x.req.MaxTokens == 1 {
		return false
	}
	if !anyAvailable(sp.Prefill, now) || !anyAvailable(sp.Decode, now) {
		return false
	}
	return x.cost.PromptTokens-x.route.Pool.MostCached(pick, sp.Decode) >= min
}

func anyAvailable(rs []*balancer.Replica, now time.Time) bool {
	for _, r := range rs {
		if r.Available(now) {
			return true
		}
	}
	return false
}

// index is r's place in Prefill, -1 when it is not there.
func (sp *Split) index(r *balancer.Replica) int {
	for i, p := range sp.Prefill {
		if p == r {
			return i
		}
	}
	return -1
}

// The prefill step's acts (flow.go's act).
const (
	// actPrefillAdmit: wait in the prefill step's admission queue
	// (Server.prefillAdmitWatched), then prefillAdmitted.
	actPrefillAdmit act = iota + 64
	// actPrefill: send flow.pd.body to rep under lease and read its
	// whole answer, then prefilled (or abandon).
	actPrefill
)

// pdFlow is a split request's prefill step, in its flow; zero while the
// request is not split.
type pdFlow struct {
	sp       *Split
	body     []byte // the prefill request
	plain    []byte // the decode step's body without kv_transfer_params: a colocated fallback's
	ticket   admission.Ticket
	tried    []*balancer.Replica
	slot     int // 1 + the index in sp.Prefill of the replica the prefill is on; 0 none
	attempts int
}

// splitPlace is where place splits a request that pays: its prefill step
// begins (admission, then actPrefill). ok is false for a request served
// colocated.
func (f *flow) splitPlace() (a act, ok bool) {
	x := f.x
	sp := x.route.Split
	if sp == nil || f.plainOnly || f.cont || !sp.pays(x, &f.pick, f.s.now()) {
		return 0, false
	}
	body, err := prefillBody(f.body)
	if err != nil {
		return 0, false // not an object the router can edit: colocated, where the engine judges it
	}
	f.pd = pdFlow{sp: sp, body: body}
	x.pd = &pdRecord{path: pdSplit}
	// The pool's queue may admit the next request now: this one's decode
	// replica is leased only after its prefill, which must not hold the
	// queue meanwhile (admission lets one unplaced request out at a time).
	x.ticket.Placed()
	if ctl := sp.Admission; ctl != nil {
		t, ok := ctl.TryAdmit(f.prefillCost())
		if !ok {
			return actPrefillAdmit, true
		}
		f.pd.ticket = t
	}
	return f.prefillNext(), true
}

// prefillCost is the prefill step's admission cost: the prompt and one
// token.
func (f *flow) prefillCost() admission.Cost {
	c := f.x.cost
	c.OutputTokens = 1
	return c
}

// prefillAdmitted is the prefill step's admission after a wait.
func (f *flow) prefillAdmitted(t admission.Ticket, err error) act {
	if err != nil {
		return f.end(err)
	}
	f.pd.ticket = t
	return f.prefillNext()
}

// prefillNext picks a prefill replica not tried yet by the prefill
// policy and sends the prefill there (actPrefill); none left, or the
// tries used up, serves the request colocated.
func (f *flow) prefillNext() act {
	x, pd := f.x, &f.pd
	for pd.attempts < f.s.cfg.MaxAttempts {
		cands := pd.sp.untried(pd.tried)
		rep := pickAmong(pd.sp.Picker, &f.pick, cands)
		if rep == nil {
			break
		}
		pd.tried = append(pd.tried, rep)
		up := f.s.upstreamOf(f.rt, rep)
		if up == nil {
			continue
		}
		lease, err := rep.AcquireRequest(balancer.LeaseCost{Work: f.s.score.Cost(x.cost.PromptTokens, 0) + 1,
			PromptTokens: int64(x.cost.PromptTokens), OutputTokens: 1})
		if err != nil {
			continue // an open breaker
		}
		pd.attempts++
		if i := pd.sp.index(rep); i >= 0 {
			pd.slot = i + 1
			pd.sp.inFlight[i].Add(1)
		}
		pd.ticket.Placed() // counted on its replica: the prefill queue may let the next one out
		f.rep, f.up, f.lease, f.sending = rep, up, lease, true
		x.pd.prefillReplica, x.pd.prefillAttempts = rep.Name(), pd.attempts
		x.pd.prefillSent = f.s.now()
		return actPrefill
	}
	return f.colocate()
}

// untried are the prefill replicas not in tried, only those under
// PrefillsPerReplica when some are: the step's admission counted a place
// on one of them.
func (sp *Split) untried(tried []*balancer.Replica) []*balancer.Replica {
	limit := int64(sp.perReplica())
	cands := make([]*balancer.Replica, 0, len(sp.Prefill))
	room := 0 // at the front of cands: those with room
	for i, r := range sp.Prefill {
		if slices.Contains(tried, r) {
			continue
		}
		cands = append(cands, r)
		if sp.inFlight[i].Load() < limit {
			cands[room], cands[len(cands)-1] = cands[len(cands)-1], cands[room]
			room++
		}
	}
	if room > 0 {
		return cands[:room]
	}
	return cands
}

// pickAmong is pk's pick among cands.
func pickAmong(pk balancer.Picker, r *balancer.Request, cands []*balancer.Replica) *balancer.Replica {
	if len(cands) == 0 {
		return nil
	}
	return pk.Pick(r, cands)
}

// prefilled is the prefill's end on f.rep: the engine's status and whole
// body, or err before any. A prefill that gave kv_transfer_params goes
// on to the decode step; one refused or failed tries another prefill
// replica; anything else serves the request colocated.
func (f *flow) prefilled(status int, body []byte, err error) act {
	x, rep, lease := f.x, f.rep, f.lease
	f.sending = false
	f.prefillOver()
	now := f.s.now()
	x.pd.prefillDone = now
	switch {
	case err != nil:
		err = upstreamError(rep, err)
		if errors.Is(err, errUnreachable) {
			lease.Done(balancer.ErrNotReplicaFault)
			rep.MarkDown()
		} else {
			lease.Done(err)
		}
		f.tried = append(f.tried, rep) // nor for the request served colocated
		f.s.m.pd.retries.WithLabelValues(x.route.Pool.Model(), retryReason(err)).Inc()
		return f.prefillNext()
	case status == fasthttp.StatusTooManyRequests || status == fasthttp.StatusServiceUnavailable:
		rep.Rest(now, now.Add(time.Second))
		lease.Done(balancer.ErrNotReplicaFault)
		f.tried = append(f.tried, rep)
		f.s.m.pd.retries.WithLabelValues(x.route.Pool.Model(), strconv.Itoa(status)).Inc()
		return f.prefillNext()
	case status != fasthttp.StatusOK:
		// The engine's word on the request itself (a 400) is the client's
		// to read: the decode replica, serving it whole, says it again.
		lease.Done(fmt.Errorf("prefill answered %d", status))
		return f.colocate()
	}
	lease.PrefillDone()
	lease.Done(nil)
	kv := kvParamsOf(body)
	if kv == nil {
		return f.colocate() // a replica without a connector, or a prompt that ended early
	}
	dec, err := decodeBody(f.body, kv)
	if err != nil {
		return f.colocate()
	}
	f.pd.plain, f.body = f.body, dec
	x.pd.remote = true
	// Only replicas that take a remote prefill are candidates.
	f.tried = f.tried[:0]
	for _, r := range x.route.Pool.Replicas() {
		if !slices.Contains(f.pd.sp.Decode, r) {
			f.tried = append(f.tried, r)
		}
	}
	return f.next()
}

// decodeFallback is the decode step's end when no replica that takes a
// remote prefill is left to try: the request is served colocated, with
// its own body, by a replica not tried yet. False when the request is not
// in its decode step.
func (f *flow) decodeFallback() bool {
	x := f.x
	if !x.pd.remoteKV() {
		return false
	}
	x.pd.remote, x.pd.path = false, pdFallback
	f.body = f.pd.plain
	tried := f.tried[:0]
	for _, r := range f.tried {
		if slices.Contains(f.pd.sp.Decode, r) {
			tried = append(tried, r)
		}
	}
	f.tried = tried
	return true
}

// sameBody reports whether a and b are one body (the same bytes in
// memory), as a request built with b holds it.
func sameBody(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// colocate gives up the split: the request is served whole by a replica
// of the pool, as if it had never been split.
func (f *flow) colocate() act {
	f.x.pd.path = pdFallback
	return f.next()
}

// prefillOver gives back what the prefill step held at the router: its
// place on its replica and its admission ticket. Idempotent.
func (f *flow) prefillOver() {
	pd := &f.pd
	if pd.slot > 0 {
		pd.sp.inFlight[pd.slot-1].Add(-1)
		pd.slot = 0
	}
	pd.ticket.Release()
	pd.ticket = admission.Ticket{}
}

// kvParamsOf is the top-level kv_transfer_params of a prefill's answer,
// nil when absent or null.
func kvParamsOf(body []byte) json.RawMessage {
	var v struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if json.Unmarshal(body, &v) != nil || len(v.KV) == 0 || string(v.KV) == "null" {
		return nil
	}
	return v.KV
}

// prefillKV is what the prefill request asks of the prefill replica's
// connector, as vLLM's proxy sends it.
var prefillKV = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// prefillBody is the prefill request made from body, the client's request:
// one token, not streamed, the options a prefill replica does not support
// removed (vLLM's proxy: "These args are not supported for P").
func prefillBody(body []byte) ([]byte, error) {
	m, err := bodyMembers(body)
	if err != nil {
		return nil, err
	}
	one := json.RawMessage("1")
	m["max_tokens"] = one
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = one
	}
	m["stream"] = json.RawMessage("false")
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		delete(m, k)
	}
	m["kv_transfer_params"] = prefillKV
	return json.Marshal(m)
}

// decodeBody is body, the client's request, with the prefill answer's
// kv_transfer_params (kv) verbatim, in place of any the client sent.
func decodeBody(body []byte, kv json.RawMessage) ([]byte, error) {
	m, err := bodyMembers(body)
	if err != nil {
		return nil, err
	}
	m["kv_transfer_params"] = kv
	return json.Marshal(m)
}

// bodyMembers is body's top-level members; an error unless it is an object.
func bodyMembers(body []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("the body is null, not an object")
	}
	return m, nil
}
