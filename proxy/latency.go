package proxy

import (
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gpurouter/gpurouter/sketch"
	"github.com/valyala/fasthttp"
)

// The router's exact latency percentiles. Every inter-token gap and every
// queue time the router measures is counted in a DDSketch (package sketch:
// within 0.5% at any quantile) per pool and replica, in a ring of time
// windows, and GET /debug/latency merges the windows an interval overlaps.
// The Prometheus histograms keep vLLM's buckets so they compare with the
// engines' bucket by bucket, but a percentile interpolated inside a 10–25 ms
// bucket is a guess; these are not. `gpurouter bench` reads them for its
// run (bench/routerlatency.go).
//
// Memory is fixed per replica: two rings (ITL, queue) of latencyWindows
// sketches of sketch.Bins() 4-byte counters — 2 × 16 × ~7.4 KB ≈ 236 KB
// (latencyBytesPerReplica; TestLatencyMemoryPerReplica states it). A
// replica that leaves the route table keeps its rings for one retention
// (16 min), so its recent traffic stays readable, then they are dropped.

const (
	// Windows are coarse because bench never needs them fine (it
	// subtracts what the run's first window held at the start); the ring
	// reaches back 16 min, the longest run bench reads exactly.
	latencyWindow  = time.Minute // one window's width
	latencyWindows = 16          // windows per ring: 16 min of history
)

// latencyBytesPerReplica is what one replica's rings hold.
func latencyBytesPerReplica() int {
	return 2 * sketch.NewWindows(latencyWindow, latencyWindows).Bytes()
}

// replicaLatency is one replica's rings, resolved once per upstream
// (newUpstream) so the hot path only records. The replica "" of a pool
// counts the queue times of its requests that reached no replica.
type replicaLatency struct {
	model, replica string
	itl, queue     *sketch.Windows
	retired        time.Time // guarded by latencyStore.mu; zero while in the route table
}

// latencyStore holds every replica's rings, keyed by pool model and
// replica name, across route-table changes. The zero value is not usable:
// newLatencyStore.
type latencyStore struct {
	mu     sync.Mutex
	byKey  map[latencyKey]*replicaLatency
	models []string // pool models in route-table order, for the document
}

type latencyKey struct{ model, replica string }

func newLatencyStore() *latencyStore {
	return &latencyStore{byKey: make(map[latencyKey]*replicaLatency)}
}

// forReplica returns the rings of (model, replica), making them on first
// use; a retired replica that is back is served again.
func (ls *latencyStore) forReplica(model, replica string) *replicaLatency {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	k := latencyKey{model, replica}
	rl := ls.byKey[k]
	if rl == nil {
		rl = &replicaLatency{model: model, replica: replica,
			itl: sketch.NewWindows(latencyWindow, latencyWindows), queue: sketch.NewWindows(latencyWindow, latencyWindows)}
		ls.byKey[k] = rl
	}
	rl.retired = time.Time{}
	return rl
}

// retain follows a new route table: replicas outside it are retired at
// now, and dropped once retired for longer than the rings reach back.
func (ls *latencyStore) retain(rt *routeTable, now time.Time) {
	live := make(map[*replicaLatency]bool, len(rt.upstreams))
	for _, u := range rt.upstreams {
		live[u.lat] = true
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.models = ls.models[:0]
	pools := make(map[string]bool, len(rt.pools))
	for _, p := range rt.pools {
		ls.models = append(ls.models, p.Model())
		pools[p.Model()] = true
	}
	for k, rl := range ls.byKey {
		switch {
		case live[rl] || k.replica == "" && pools[k.model]:
			rl.retired = time.Time{}
		case rl.retired.IsZero():
			rl.retired = now
		case now.Sub(rl.retired) > latencyWindow*latencyWindows:
			delete(ls.byKey, k)
		}
	}
}

// recordGap counts one inter-token gap at now in the replica that sent it.
func (x *exchange) recordGap(now time.Time, gap time.Duration) {
	if x.up != nil {
		x.up.lat.itl.Record(now, gap)
	}
}

// recordQueue counts the request's router queue time (received →
// admitted) at admitted, in the replica that answered, or in its pool's
// replica "" when none did.
func (x *exchange) recordQueue(admitted time.Time) {
	q := admitted.Sub(x.received)
	if x.up != nil {
		x.up.lat.queue.Record(admitted, q)
		return
	}
	x.s.lat.forReplica(x.route.Pool.Model(), "").queue.Record(admitted, q)
}

// latencyQuantiles are the percentiles the document spells out; the
// serialized sketch answers any other.
var latencyQuantiles = [...]struct {
	name string
	q    float64
}{{"p50", 0.5}, {"p90", 0.9}, {"p95", 0.95}, {"p99", 0.99}, {"p99.9", 0.999}}

// LatencySummary is one sketch in the /debug/latency document: its
// statistics in seconds (quantiles within 0.5%, the rest exact) and the
// sketch itself, which merges and subtracts (package sketch's Snapshot).
//
// LatencyDoc and its parts are a JSON contract with bench.RouterLatency,
// which restates them so bench reads remote routers without importing the
// router; bench's router_schema_test.go fails when the two disagree.
type LatencySummary struct {
	Count     uint64             `json:"count"`
	MeanS     float64            `json:"mean_s"`
	MinS      float64            `json:"min_s"`
	MaxS      float64            `json:"max_s"`
	Quantiles map[string]float64 `json:"quantiles_s"`
	Sketch    sketch.Snapshot    `json:"sketch"`
}

func summarize(s sketch.Snapshot) LatencySummary {
	out := LatencySummary{Count: s.Count, Sketch: s, Quantiles: map[string]float64{}}
	if s.Count == 0 {
		out.Sketch.Counts = []uint64{}
		return out
	}
	out.MeanS = s.Mean().Seconds()
	out.MinS, out.MaxS = time.Duration(s.MinNs).Seconds(), time.Duration(s.MaxNs).Seconds()
	for _, lq := range latencyQuantiles {
		v, _ := s.Quantile(lq.q)
		out.Quantiles[lq.name] = v.Seconds()
	}
	return out
}

// LatencyReplica is one replica's row of the document.
type LatencyReplica struct {
	// Replica is "" for the pool's requests that reached no replica.
	Replica string `json:"replica"`
	// Served is false for a replica no longer in the route table.
	Served     bool           `json:"served"`
	FromUnixNs int64          `json:"from_unix_ns"`
	ITL        LatencySummary `json:"itl"`
	Queue      LatencySummary `json:"queue"`
}

// LatencyPool is one pool of the document: its replicas and their merge.
type LatencyPool struct {
	Model string `json:"model"`
	// ITL and Queue merge the pool's replicas.
	ITL      LatencySummary   `json:"itl"`
	Queue    LatencySummary   `json:"queue"`
	Replicas []LatencyReplica `json:"replicas"`
}

// LatencyDoc is the /debug/latency document. Since and Until are the
// interval asked for; From and To are what the merged windows cover (From
// is later than Since when the oldest windows are gone: the latest of the
// replicas').
type LatencyDoc struct {
	SinceUnixNs      int64         `json:"since_unix_ns"`
	UntilUnixNs      int64         `json:"until_unix_ns"`
	FromUnixNs       int64         `json:"from_unix_ns"`
	ToUnixNs         int64         `json:"to_unix_ns"`
	WindowS          float64       `json:"window_s"`
	Windows          int           `json:"windows"`
	RelativeAccuracy float64       `json:"relative_accuracy"`
	Pools            []LatencyPool `json:"pools"`
}

// collect merges every replica's windows over [since, until].
func (ls *latencyStore) collect(since, until time.Time) LatencyDoc {
	ls.mu.Lock()
	rows := make([]*replicaLatency, 0, len(ls.byKey))
	served := make(map[*replicaLatency]bool, len(ls.byKey))
	for _, rl := range ls.byKey {
		rows = append(rows, rl)
		served[rl] = rl.retired.IsZero()
	}
	order := make(map[string]int, len(ls.models))
	for i, m := range ls.models {
		order[m] = i
	}
	ls.mu.Unlock()
	slices.SortFunc(rows, func(a, b *replicaLatency) int {
		ia, okA := order[a.model]
		ib, okB := order[b.model]
		switch {
		case okA != okB:
			if okA {
				return -1
			}
			return 1
		case okA && ia != ib:
			return ia - ib
		}
		return cmp.Or(cmp.Compare(a.model, b.model), cmp.Compare(a.replica, b.replica))
	})

	// The windows [since, until] overlaps, as far back as a ring reaches;
	// a replica whose ring lost some narrows From.
	last := windowStart(until)
	first := max(windowStart(since), last-(latencyWindows-1)*int64(latencyWindow))
	doc := LatencyDoc{SinceUnixNs: since.UnixNano(), UntilUnixNs: until.UnixNano(), FromUnixNs: first, ToUnixNs: last + int64(latencyWindow),
		WindowS: latencyWindow.Seconds(), Windows: latencyWindows, RelativeAccuracy: sketch.RelativeAccuracy, Pools: []LatencyPool{}}
	var pool *LatencyPool
	var pitl, pqueue sketch.Snapshot
	flush := func() {
		if pool != nil {
			pool.ITL, pool.Queue = summarize(pitl), summarize(pqueue)
			doc.Pools = append(doc.Pools, *pool)
		}
	}
	for _, rl := range rows {
		if pool == nil || pool.Model != rl.model {
			flush()
			pool = &LatencyPool{Model: rl.model, Replicas: []LatencyReplica{}}
			pitl, pqueue = sketch.Snapshot{}, sketch.Snapshot{}
		}
		itl, ifrom, _ := rl.itl.Collect(since, until)
		queue, qfrom, _ := rl.queue.Collect(since, until)
		from := max(ifrom.UnixNano(), qfrom.UnixNano())
		if rl.replica == "" && itl.Count == 0 && queue.Count == 0 {
			continue
		}
		doc.FromUnixNs = max(doc.FromUnixNs, from)
		pitl.Merge(itl)     //nolint:errcheck // one accuracy throughout
		pqueue.Merge(queue) //nolint:errcheck
		pool.Replicas = append(pool.Replicas, LatencyReplica{Replica: rl.replica, Served: served[rl],
			FromUnixNs: from, ITL: summarize(itl), Queue: summarize(queue)})
	}
	flush()
	return doc
}

// serveDebugLatency answers GET /debug/latency?since=UNIX_NS&until=UNIX_NS:
// per pool and replica, the router's ITL and queue-time sketches merged
// over the windows the interval overlaps. until defaults to now and since
// to until minus the retention; either later than now counts as now, so a
// client whose clock runs ahead reads the current window.
func (s *Server) serveDebugLatency(ctx *fasthttp.RequestCtx) {
	now := s.now()
	args := ctx.QueryArgs()
	until := now
	if v, err := strconv.ParseInt(string(args.Peek("until")), 10, 64); err == nil {
		until = time.Unix(0, v)
	}
	until = minTime(until, now)
	since := until.Add(-latencyWindow * latencyWindows)
	if v, err := strconv.ParseInt(string(args.Peek("since")), 10, 64); err == nil {
		since = minTime(time.Unix(0, v), now)
	}
	b, err := json.Marshal(s.lat.collect(since, until))
	if err != nil {
		writeError(ctx, err)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// windowStart is the Unix ns at which t's window begins (windows are
// aligned to the epoch, as sketch.Windows aligns them).
func windowStart(t time.Time) int64 {
	ns, w := t.UnixNano(), int64(latencyWindow)
	return ns - ((ns%w)+w)%w
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
