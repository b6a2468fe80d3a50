package observe

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/gpurouter/gpurouter/sketch"
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
// Memory is fixed per replica: two rings (ITL, queue) of LatencyWindows
// sketches of sketch.Bins() 4-byte counters — 2 × 16 × ~7.4 KB ≈ 236 KB
// (latencyBytesPerReplica; TestLatencyMemoryPerReplica states it). A
// replica that leaves the route table keeps its rings for one retention
// (16 min), so its recent traffic stays readable, then they are dropped.

const (
	// Windows are coarse because bench never needs them fine (it
	// subtracts what the run's first window held at the start); the ring
	// reaches back 16 min, the longest run bench reads exactly.
	LatencyWindow  = time.Minute // one window's width
	LatencyWindows = 16          // windows per ring: 16 min of history
)

// LatencyRetention is how far back the rings reach.
const LatencyRetention = LatencyWindow * LatencyWindows

// latencyBytesPerReplica is what one replica's rings hold.
func latencyBytesPerReplica() int {
	return 2 * sketch.NewWindows(LatencyWindow, LatencyWindows).Bytes()
}

// ReplicaLatency is one replica's rings, resolved once per upstream
// (newUpstream) so the hot path only records. The replica "" of a pool
// counts the queue times of its requests that reached no replica.
type ReplicaLatency struct {
	model, replica string
	itl, queue     *sketch.Windows
	retired        time.Time // guarded by Latency.mu; zero while in the route table
}

// Gap counts one inter-token gap d at now.
func (rl *ReplicaLatency) Gap(now time.Time, d time.Duration) { rl.itl.Record(now, d) }

// Queued counts one router queue time d, ended at at.
func (rl *ReplicaLatency) Queued(at time.Time, d time.Duration) { rl.queue.Record(at, d) }

// Latency holds every replica's rings, keyed by pool model and
// replica name, across route-table changes. The zero value is not usable:
// NewLatency.
type Latency struct {
	mu     sync.Mutex
	byKey  map[latencyKey]*ReplicaLatency
	models []string // pool models in route-table order, for the document
}

type latencyKey struct{ model, replica string }

func NewLatency() *Latency {
	return &Latency{byKey: make(map[latencyKey]*ReplicaLatency)}
}

// forReplica returns the rings of (model, replica), making them on first
// use; a retired replica that is back is served again.
func (ls *Latency) Replica(model, replica string) *ReplicaLatency {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	k := latencyKey{model, replica}
	rl := ls.byKey[k]
	if rl == nil {
		rl = &ReplicaLatency{model: model, replica: replica,
			itl: sketch.NewWindows(LatencyWindow, LatencyWindows), queue: sketch.NewWindows(LatencyWindow, LatencyWindows)}
		ls.byKey[k] = rl
	}
	rl.retired = time.Time{}
	return rl
}

// Retain follows a new route table, whose pools serve models (in its
// order) and whose replicas' rings are live: the other replicas are
// retired at now, and dropped once retired for longer than the rings reach
// back.
func (ls *Latency) Retain(models []string, live map[*ReplicaLatency]bool, now time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.models = append(ls.models[:0], models...)
	pools := make(map[string]bool, len(models))
	for _, m := range models {
		pools[m] = true
	}
	for k, rl := range ls.byKey {
		switch {
		case live[rl] || k.replica == "" && pools[k.model]:
			rl.retired = time.Time{}
		case rl.retired.IsZero():
			rl.retired = now
		case now.Sub(rl.retired) > LatencyWindow*LatencyWindows:
			delete(ls.byKey, k)
		}
	}
}

// Quantiles are the percentiles the document spells out; the
// serialized sketch answers any other.
func Quantiles() []latencyQuantile {
	return []latencyQuantile{{"p50", 0.5}, {"p90", 0.9}, {"p95", 0.95}, {"p99", 0.99}, {"p99.9", 0.999}}
}

// Quantile is one percentile of the document: its name and rank.
type latencyQuantile struct {
	Name string
	Rank float64
}

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
	for _, lq := range Quantiles() {
		v, _ := s.Quantile(lq.Rank)
		out.Quantiles[lq.Name] = v.Seconds()
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

// Collect merges every replica's windows over [since, until].
func (ls *Latency) Collect(since, until time.Time) LatencyDoc {
	ls.mu.Lock()
	rows := make([]*ReplicaLatency, 0, len(ls.byKey))
	served := make(map[*ReplicaLatency]bool, len(ls.byKey))
	for _, rl := range ls.byKey {
		rows = append(rows, rl)
		served[rl] = rl.retired.IsZero()
	}
	order := make(map[string]int, len(ls.models))
	for i, m := range ls.models {
		order[m] = i
	}
	ls.mu.Unlock()
	slices.SortFunc(rows, func(a, b *ReplicaLatency) int {
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
	first := max(windowStart(since), last-(LatencyWindows-1)*int64(LatencyWindow))
	doc := LatencyDoc{SinceUnixNs: since.UnixNano(), UntilUnixNs: until.UnixNano(), FromUnixNs: first, ToUnixNs: last + int64(LatencyWindow),
		WindowS: LatencyWindow.Seconds(), Windows: LatencyWindows, RelativeAccuracy: sketch.RelativeAccuracy, Pools: []LatencyPool{}}
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

// windowStart is the Unix ns at which t's window begins (windows are
// aligned to the epoch, as sketch.Windows aligns them).
func windowStart(t time.Time) int64 {
	ns, w := t.UnixNano(), int64(LatencyWindow)
	return ns - ((ns%w)+w)%w
}
