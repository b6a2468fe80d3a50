package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// The router's side of a run. gpurouter answers GET /debug/pools (its pools
// and every replica's URL: how bench finds the engines behind it, and how it
// tells a router from a bare engine, which answers non-200) and GET
// /debug/requests (a bounded ring of per-request timing records, keyed by
// X-Request-Id, which bench joins to its own Records so client and router
// latency are compared request by request rather than histogram by
// histogram).

// ErrNotRouter means the server answered GET /debug/pools with a non-200
// status: it is not a gpurouter (a bare engine, usually).
var ErrNotRouter = errors.New("bench: not a gpurouter (GET /debug/pools answered non-200)")

// RouterRecord is one finished request as the router measured it: the JSON
// of a /debug/requests record. Times are Unix nanoseconds (0 = did not
// happen); durations are seconds. "Received" is when the router had read
// the whole request, the router's equivalent of the client's Sent.
//
// It restates observe.Record's JSON schema on purpose, so bench reads a
// remote router without importing router internals; router_schema_test.go
// fails when the two disagree (field names, kinds, values through a round
// trip), and the router's schema is the contract.
type RouterRecord struct {
	RequestID        string  `json:"request_id"`
	Model            string  `json:"model"`
	Replica          string  `json:"replica"`
	Status           int     `json:"status"`
	Outcome          string  `json:"outcome"`
	Stream           bool    `json:"stream"`
	Attempts         int     `json:"attempts"`
	ReceivedNs       int64   `json:"received_unix_ns"`
	AdmittedNs       int64   `json:"admitted_unix_ns"`
	FirstByteNs      int64   `json:"first_byte_unix_ns"`
	FirstTokenNs     int64   `json:"first_token_unix_ns"`
	DoneNs           int64   `json:"done_unix_ns"`
	QueueS           float64 `json:"queue_s"`
	TTFTS            float64 `json:"ttft_s"`
	E2ES             float64 `json:"e2e_s"`
	ITLMeanS         float64 `json:"itl_mean_s"`
	ITLMaxS          float64 `json:"itl_max_s"`
	ITLCount         int     `json:"itl_count"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	EstPromptTokens  int     `json:"est_prompt_tokens"` // the router's estimate before the engine answered
	// A stream continued on another replica after its own failed
	// (outcome "migrated"): how often, over which replicas ("r0>r1"), and
	// the longest pause its client saw.
	Migrations      int     `json:"migrations"`
	ReplicaChain    string  `json:"replica_chain"`
	MigrationStallS float64 `json:"migration_stall_s"`
	// The TTFT the router's latency predictor expected when it sent the
	// request to its replica, and the TTFT measured over the same span
	// (sent → first token); 0 when unknown.
	PredictedTTFTS float64 `json:"predicted_ttft_s,omitempty"`
	PlacedTTFTS    float64 `json:"placed_ttft_s,omitempty"`
	// A request the router split between a prefill and a decode replica:
	// "split", or "fallback" when it was served colocated after all ("" if
	// never split); its prefill's replica and tries; its TTFT in phases
	// (prefill, the router's handoff, the KV read and first decode step).
	PDPath          string  `json:"pd_path,omitempty"`
	PrefillReplica  string  `json:"prefill_replica,omitempty"`
	PrefillAttempts int     `json:"prefill_attempts,omitempty"`
	PrefillS        float64 `json:"prefill_s,omitempty"`
	HandoffS        float64 `json:"handoff_s,omitempty"`
	DecodeFirstS    float64 `json:"decode_first_s,omitempty"`
}

// OK reports whether the router served the request to the end (a stream
// continued on another replica included).
func (r *RouterRecord) OK() bool {
	return (r.Outcome == "ok" || r.Outcome == "migrated") && r.FirstTokenNs != 0
}

// TPOTSeconds is the router-side (e2e − TTFT) / (tokens − 1), 0 for fewer
// than two tokens, as Record.TPOT.
func (r *RouterRecord) TPOTSeconds() float64 {
	if r.CompletionTokens < 2 {
		return 0
	}
	return (r.E2ES - r.TTFTS) / float64(r.CompletionTokens-1)
}

// RouterPool is one pool of GET /debug/pools.
type RouterPool struct {
	Model    string          `json:"model"`
	Aliases  []string        `json:"aliases"`
	Policy   string          `json:"policy"`
	Replicas []RouterReplica `json:"replicas"`
}

// RouterReplica is one replica of a RouterPool, as the router sees it.
type RouterReplica struct {
	Name     string  `json:"name"`
	URL      string  `json:"url"`
	Weight   float64 `json:"weight"`
	Healthy  bool    `json:"healthy"`
	Breaker  string  `json:"breaker"`
	InFlight int64   `json:"in_flight"`
	Served   int64   `json:"served"`
	// Predictor is the router's learned latency model of the replica
	// (absent on routers without one).
	Predictor *RouterPredictor `json:"predictor,omitempty"`
	// PrefixCache is the router's prefix index view of the replica
	// (absent where its pool has none).
	PrefixCache *RouterPrefix `json:"prefix_cache,omitempty"`
}

// RouterPrefix is what bench reads of a replica's prefix index: the
// prompt tokens placed there with keys since the router started, and how
// many of them the index predicted cached.
type RouterPrefix struct {
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"predicted_cached_tokens"`
	// ForgoneTokens is how many more of those tokens another replica held.
	ForgoneTokens int64 `json:"forgone_cached_tokens"`
}

// PrefixCounts are the router's prefix index counters summed over its
// replicas (PrefixTotals).
type PrefixCounts struct {
	Prompt  int64 // prompt tokens placed with keys
	Cached  int64 // of those, predicted cached where they were placed
	Forgone int64 // of those, held beyond that by another replica
}

// PrefixTotals sums the replicas' prefix index counters over pools.
func PrefixTotals(pools []RouterPool) PrefixCounts {
	var t PrefixCounts
	for _, p := range pools {
		for _, r := range p.Replicas {
			if r.PrefixCache != nil {
				t.Prompt += r.PrefixCache.PromptTokens
				t.Cached += r.PrefixCache.CachedTokens
				t.Forgone += r.PrefixCache.ForgoneTokens
			}
		}
	}
	return t
}

// RouterPredictor is the part of a replica's learned latency model bench
// reads: the prefill cost per token, the measured prefill speed (prompt
// tokens per second of TTFT: the replica's capacity as the router measured
// it) and how many requests taught them.
type RouterPredictor struct {
	TTFTPerToken      float64 `json:"ttft_s_per_token"`
	TTFTSamples       int64   `json:"ttft_samples"`
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s"`
}

// RouterAPI reads a gpurouter's debug endpoints. The zero value is usable:
// a fresh fasthttp.Client and a 10 s timeout per call.
type RouterAPI struct {
	// Client does the requests; nil means a default fasthttp.Client.
	Client *fasthttp.Client
	// Timeout bounds one call; 0 means 10 s.
	Timeout time.Duration
	// Headers are added to every call (e.g. Authorization).
	Headers map[string]string
}

// Pools returns the router's pools. A server that answers non-200 is not a
// router: the error is ErrNotRouter.
func (a *RouterAPI) Pools(ctx context.Context, baseURL string) ([]RouterPool, error) {
	var doc struct {
		Pools []RouterPool `json:"pools"`
	}
	status, err := a.getJSON(ctx, joinURL(baseURL, "/debug/pools"), &doc)
	if status != 0 && status != fasthttp.StatusOK {
		return nil, fmt.Errorf("%w: %d", ErrNotRouter, status)
	}
	if err != nil {
		return nil, err
	}
	return doc.Pools, nil
}

// Records returns the router's records of requests finished at or after
// since, oldest first; limit > 0 keeps only the newest limit of them.
func (a *RouterAPI) Records(ctx context.Context, baseURL string, since time.Time, limit int) ([]RouterRecord, error) {
	u := joinURL(baseURL, "/debug/requests") + "?since=" + strconv.FormatInt(since.UnixNano(), 10)
	if limit > 0 {
		u += "&limit=" + strconv.Itoa(limit)
	}
	var doc struct {
		Records []RouterRecord `json:"records"`
	}
	status, err := a.getJSON(ctx, u, &doc)
	if err == nil && status != fasthttp.StatusOK {
		err = fmt.Errorf("bench: GET %s: status %d", u, status)
	}
	return doc.Records, err
}

// getJSON GETs url and decodes a 200 body into v. It returns the status (0
// when no response came).
func (a *RouterAPI) getJSON(ctx context.Context, url string, v any) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c := a.Client
	if c == nil {
		c = &fasthttp.Client{Name: "gpurouter-bench"}
	}
	timeout := a.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.Set("Accept", "application/json")
	for k, val := range a.Headers {
		req.Header.Set(k, val)
	}
	if err := c.DoDeadline(req, resp, deadline); err != nil {
		return 0, fmt.Errorf("bench: GET %s: %w", url, err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return resp.StatusCode(), nil
	}
	body, err := resp.BodyUncompressed()
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		return resp.StatusCode(), fmt.Errorf("bench: GET %s: %w", url, err)
	}
	return resp.StatusCode(), nil
}

// joinURL appends path to a base URL given with or without a trailing
// slash, as the load generator joins its endpoint.
func joinURL(base, path string) string { return strings.TrimRight(base, "/") + path }

// EngineURLs returns the replica URLs of the pool that serves model (by
// name or alias), or of every pool when none does; each URL once, in the
// router's order.
func EngineURLs(pools []RouterPool, model string) []string {
	var chosen []RouterPool
	for _, p := range pools {
		if p.Model == model || slices.Contains(p.Aliases, model) {
			chosen = append(chosen, p)
		}
	}
	if len(chosen) == 0 {
		chosen = pools
	}
	var urls []string
	for _, p := range chosen {
		for _, r := range p.Replicas {
			if r.URL != "" && !slices.Contains(urls, r.URL) {
				urls = append(urls, r.URL)
			}
		}
	}
	return urls
}

// MatchedRequest is one request seen by both sides: the client's Record
// and the router's record with the same X-Request-Id.
type MatchedRequest struct {
	Client *Record
	Router RouterRecord
}

// TTFTDiff is client TTFT − router TTFT: sending the request to the router
// plus relaying the first token back (network and router overhead).
func (m MatchedRequest) TTFTDiff() time.Duration { return m.Client.TTFT - secs(m.Router.TTFTS) }

// E2EDiff is client e2e − router e2e: sending the request to the router
// plus relaying the last token back.
func (m MatchedRequest) E2EDiff() time.Duration { return m.Client.E2E - secs(m.Router.E2ES) }

// PromptEstimateError summarises the router's prompt-token estimates
// against the engine's counts over matched requests: the signed relative
// error (est − engine) / engine, in percent; n is how many requests had
// both numbers.
func (m RouterMatch) PromptEstimateError(ps []float64) (d Dist, n int) {
	var errs []float64
	for _, p := range m.Pairs {
		if p.Router.EstPromptTokens > 0 && p.Router.PromptTokens > 0 {
			errs = append(errs, 100*float64(p.Router.EstPromptTokens-p.Router.PromptTokens)/float64(p.Router.PromptTokens))
		}
	}
	if len(errs) == 0 {
		return Dist{}, 0
	}
	return newDist(errs, ps), len(errs)
}

// RouterMatch is the join of a run's records with the router's.
type RouterMatch struct {
	// Pairs are the client's completed requests that have a router record
	// the router also completed, in Result.Records order.
	Pairs []MatchedRequest
	// Completed is the number of completed client requests.
	Completed int
	// Unmatched are the IDs of completed client requests with no completed
	// router record (not received, or already overwritten in the ring).
	Unmatched []string
}

// MatchRouterRecords joins res's completed requests to recs by request id.
func MatchRouterRecords(res *Result, recs []RouterRecord) RouterMatch {
	byID := make(map[string]int, len(recs))
	for i := range recs {
		if recs[i].OK() {
			byID[recs[i].RequestID] = i
		}
	}
	var m RouterMatch
	for i := range res.Records {
		c := &res.Records[i]
		if !c.OK() {
			continue
		}
		m.Completed++
		j, ok := byID[c.ID]
		if !ok {
			m.Unmatched = append(m.Unmatched, c.ID)
			continue
		}
		m.Pairs = append(m.Pairs, MatchedRequest{Client: c, Router: recs[j]})
	}
	return m
}

// RouterDists are the router's per-request latencies over matched
// requests, in ms, with vllm's statistics (exact, not from buckets). ITL is
// summarised per request by the router, so only its mean (weighted by
// gaps, i.e. the pooled mean) and maximum are exact; ITLMean is NaN when no
// request had two chunks.
type RouterDists struct {
	TTFT, TPOT, E2E, Queue Dist
	ITLMean, ITLMax        float64
}

// Dists summarises the router's side of the matched requests.
func (m RouterMatch) Dists(ps []float64) RouterDists {
	var ttft, tpot, e2e, queue []float64
	var gapSum, gapMax float64
	gaps := 0
	for _, p := range m.Pairs {
		r := p.Router
		ttft = append(ttft, r.TTFTS*1000)
		e2e = append(e2e, r.E2ES*1000)
		queue = append(queue, r.QueueS*1000)
		if r.CompletionTokens > 1 {
			tpot = append(tpot, r.TPOTSeconds()*1000)
		}
		gapSum += r.ITLMeanS * float64(r.ITLCount)
		gaps += r.ITLCount
		gapMax = max(gapMax, r.ITLMaxS)
	}
	d := RouterDists{TTFT: newDist(ttft, ps), TPOT: newDist(tpot, ps), E2E: newDist(e2e, ps), Queue: newDist(queue, ps), ITLMean: math.NaN()}
	if gaps > 0 {
		d.ITLMean, d.ITLMax = gapSum/float64(gaps)*1000, gapMax*1000
	}
	return d
}

// Diffs are the per-request client − router differences in ms: TTFT and
// e2e, each a Dist over the matched requests.
func (m RouterMatch) Diffs(ps []float64) (ttft, e2e Dist) {
	t := make([]float64, len(m.Pairs))
	e := make([]float64, len(m.Pairs))
	for i, p := range m.Pairs {
		t[i], e[i] = ms(p.TTFTDiff()), ms(p.E2EDiff())
	}
	return newDist(t, ps), newDist(e, ps)
}

// ITLDiffs is, per matched request with gaps on both sides, the client's
// mean inter-token gap minus the router's, in ms: what the way from the
// router to the client adds to each gap of the request, on average. Mean
// gaps compare exactly ((last − first token) / gaps on each side), so this
// holds even where pooled percentiles would need a sketch.
func (m RouterMatch) ITLDiffs(ps []float64) Dist {
	var d []float64
	for _, p := range m.Pairs {
		if p.Router.ITLCount == 0 || len(p.Client.ITLs) == 0 {
			continue
		}
		var sum time.Duration
		for _, g := range p.Client.ITLs {
			sum += g
		}
		d = append(d, ms(sum)/float64(len(p.Client.ITLs))-p.Router.ITLMeanS*1000)
	}
	return newDist(d, ps)
}

// secs converts float seconds to a Duration, rounded to the nanosecond.
func secs(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }
