package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/sketch"
	"github.com/valyala/fasthttp"
)

// The router's exact ITL and queue-time percentiles for a run. A gpurouter
// counts every inter-token gap and every queue time in DDSketches (package
// sketch: within 0.5% at any quantile) per pool and replica, in time windows,
// and serves them merged over an interval at GET /debug/latency. Windows
// are coarse (a minute), so bench reads the current window when the run starts
// and everything from that window on when it ends, and subtracts: what is
// left is exactly what the router measured during the run (plus whatever
// other traffic the router served meanwhile).

// Errors of reading the router's sketches.
var (
	// ErrNoLatencyEndpoint means the router answered GET /debug/latency
	// with 404: a gpurouter from before the endpoint. Bench then reads ITL
	// percentiles from the router's histogram, as it did before.
	ErrNoLatencyEndpoint = errors.New("bench: the router has no /debug/latency (an older gpurouter)")
	// ErrSketchRetention means the router no longer holds the window the
	// run started in: the run outlasted its windows' retention.
	ErrSketchRetention = errors.New("bench: the router's sketch windows no longer reach back to the run's start")
)

// RouterLatency is the JSON of GET /debug/latency. It restates
// observe.LatencyDoc on purpose, as RouterRecord restates observe.Record;
// router_schema_test.go holds the two together.
type RouterLatency struct {
	SinceUnixNs      int64               `json:"since_unix_ns"`
	UntilUnixNs      int64               `json:"until_unix_ns"`
	FromUnixNs       int64               `json:"from_unix_ns"`
	ToUnixNs         int64               `json:"to_unix_ns"`
	WindowS          float64             `json:"window_s"`
	Windows          int                 `json:"windows"`
	RelativeAccuracy float64             `json:"relative_accuracy"`
	Pools            []RouterLatencyPool `json:"pools"`
}

// RouterLatencyPool is one pool of a RouterLatency.
type RouterLatencyPool struct {
	Model    string                 `json:"model"`
	ITL      RouterLatencySummary   `json:"itl"`
	Queue    RouterLatencySummary   `json:"queue"`
	Replicas []RouterLatencyReplica `json:"replicas"`
}

// RouterLatencyReplica is one replica of a RouterLatencyPool ("" for the
// pool's requests that reached no replica).
type RouterLatencyReplica struct {
	Replica    string               `json:"replica"`
	Served     bool                 `json:"served"`
	FromUnixNs int64                `json:"from_unix_ns"`
	ITL        RouterLatencySummary `json:"itl"`
	Queue      RouterLatencySummary `json:"queue"`
}

// RouterLatencySummary is one sketch and the router's reading of it, in
// seconds.
type RouterLatencySummary struct {
	Count     uint64             `json:"count"`
	MeanS     float64            `json:"mean_s"`
	MinS      float64            `json:"min_s"`
	MaxS      float64            `json:"max_s"`
	Quantiles map[string]float64 `json:"quantiles_s"`
	Sketch    sketch.Snapshot    `json:"sketch"`
}

// Latency reads the router's sketches over [since, until]; a zero time is
// left out (the router's defaults: until now, since a full retention
// before). A router without the endpoint is ErrNoLatencyEndpoint.
func (a *RouterAPI) Latency(ctx context.Context, baseURL string, since, until time.Time) (*RouterLatency, error) {
	u := joinURL(baseURL, "/debug/latency")
	sep := "?"
	for _, p := range []struct {
		name string
		t    time.Time
	}{{"since", since}, {"until", until}} {
		if !p.t.IsZero() {
			u += sep + p.name + "=" + strconv.FormatInt(p.t.UnixNano(), 10)
			sep = "&"
		}
	}
	var doc RouterLatency
	status, err := a.getJSON(ctx, u, &doc)
	switch {
	case err != nil:
		return nil, err
	case status == fasthttp.StatusNotFound:
		return nil, ErrNoLatencyEndpoint
	case status != fasthttp.StatusOK:
		return nil, fmt.Errorf("bench: GET %s: status %d", u, status)
	}
	return &doc, nil
}

// RouterSketches are the router's sketches of one run, summed over the
// replicas of the pools it served: every inter-token gap (ITL) and every
// router queue time, each quantile within Accuracy.
type RouterSketches struct {
	ITL, Queue sketch.Snapshot
	Accuracy   float64
}

// RunSketches is after − before summed over the replicas of the pools
// named in models (every pool when models is empty): the router's sketches
// of what happened between the two reads. after must have been read from
// before's From on; when the router had dropped that window by then, the
// error is ErrSketchRetention.
func RunSketches(before, after *RouterLatency, models []string) (RouterSketches, error) {
	out := RouterSketches{Accuracy: after.RelativeAccuracy}
	if after.FromUnixNs != before.FromUnixNs {
		return out, fmt.Errorf("%w (window from %s, the router now holds from %s on; it keeps %d × %gs)", ErrSketchRetention,
			time.Unix(0, before.FromUnixNs).UTC().Format(time.TimeOnly), time.Unix(0, after.FromUnixNs).UTC().Format(time.TimeOnly), after.Windows, after.WindowS)
	}
	type key struct{ model, replica string }
	prior := map[key]RouterLatencyReplica{}
	for _, p := range before.Pools {
		for _, r := range p.Replicas {
			prior[key{p.Model, r.Replica}] = r
		}
	}
	for _, p := range after.Pools {
		if len(models) > 0 && !slices.Contains(models, p.Model) {
			continue
		}
		for _, r := range p.Replicas {
			b := prior[key{p.Model, r.Replica}]
			for _, part := range []struct {
				sum         *sketch.Snapshot
				after, prev sketch.Snapshot
				what        string
			}{{&out.ITL, r.ITL.Sketch, b.ITL.Sketch, "ITL"}, {&out.Queue, r.Queue.Sketch, b.Queue.Sketch, "queue"}} {
				d, err := part.after.Sub(part.prev)
				if err == nil {
					err = part.sum.Merge(d)
				}
				if err != nil {
					return out, fmt.Errorf("bench: router %s sketch of %s/%s: %w", part.what, p.Model, r.Replica, err)
				}
			}
		}
	}
	return out, nil
}

// PoolModels are the models of the pools that serve model (by name or
// alias), or of every pool when none does: the pools a run's traffic went
// to.
func PoolModels(pools []RouterPool, model string) []string {
	var all, chosen []string
	for _, p := range pools {
		all = append(all, p.Model)
		if p.Model == model || slices.Contains(p.Aliases, model) {
			chosen = append(chosen, p.Model)
		}
	}
	if len(chosen) == 0 {
		return all
	}
	return chosen
}
