package observe

import (
	_ "embed"
	"html/template"
	"io"
	"strconv"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
)

// The status page (GET /status, and /) is what an operator opens first, as
// HAProxy's stats page or Envoy's admin page: every pool, its replicas with
// their live load, the admission queue and the latest requests with their
// timings. It is rendered on the server and refreshes itself with a meta
// refresh, so it needs no JavaScript. It shows nothing a client could use
// against the router: no replica URLs (a client could bypass the router's
// keys and limits with them), no API keys or key ids.

// StatusRefreshSeconds is how often the page reloads itself.
const StatusRefreshSeconds = 5

// StatusRecent is how many of the latest requests the page lists.
const StatusRecent = 25

//go:embed status.html
var statusHTML string

// statusTemplate is parsed once; it is never changed after.
var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"ms":    func(s float64) string { return strconv.FormatFloat(s*1000, 'f', 1, 64) },
	"pct":   func(r float64) string { return strconv.FormatFloat(r*100, 'f', 1, 64) },
	"gib":   func(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<30), 'f', 1, 64) },
	"num":   func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"age":   func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"clock": func(ns int64) string { return time.Unix(0, ns).Format("15:04:05.000") },
}).Parse(statusHTML))

// RenderStatus writes the page of v.
func RenderStatus(w io.Writer, v StatusView) error { return statusTemplate.Execute(w, v) }

// StatusView is everything the page shows, gathered at one instant.
type StatusView struct {
	Now            time.Time
	RefreshSeconds int
	Active         int64 // requests in progress, the router's own count
	Draining       bool
	Pools          []PoolStatus
	Recent         []Record // newest first
}

// PoolStatus is one pool on the page.
type PoolStatus struct {
	Model      string
	Aliases    []string
	Policy     string
	Arms       []balancer.Arm
	InFlight   int64
	Available  int // replicas a picker may choose now
	Admission  *admission.Stats
	MaxTokens  int
	Replicas   []replicaStatus
	PathPrefix string
}

// replicaStatus is one replica's row.
type replicaStatus struct {
	Name      string
	Healthy   bool
	Breaker   string // closed, open, half-open
	Notes     []string
	InFlight  int64
	Served    int64
	Engine    *balancer.EngineLoad // nil until the first telemetry scrape
	EngineAge time.Duration
	Capacity  float64 // the GPU capacity credited; 0 when no GPU telemetry
	GPUs      []gpu.GPUStats
}

func ReplicaStatusOf(r *balancer.Replica, now time.Time) replicaStatus {
	rs := replicaStatus{Name: r.Name(), Healthy: r.Healthy(), Breaker: r.BreakerState(), InFlight: r.InFlight(), Served: r.Served()}
	if r.Draining() {
		rs.Notes = append(rs.Notes, "draining")
	}
	if r.Resting(now) {
		rs.Notes = append(rs.Notes, "resting until "+r.RestUntil(now).Format("15:04:05"))
	}
	if e := r.EngineLoad(); e != nil {
		rs.Engine, rs.EngineAge = e, now.Sub(e.At)
	}
	if g := r.GPULoad(); g != nil {
		rs.Capacity, rs.GPUs = g.CapacityFactor, g.GPUs
		if g.Fault {
			rs.Notes = append(rs.Notes, "GPU fault (Xid/ECC): excluded")
		}
	}
	return rs
}
