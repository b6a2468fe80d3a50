package main

// The soak: many concurrent streams through a configured router to a
// simulated fleet for a while, with clients hanging up at random and one
// replica killed and restarted mid-run. Every request must be accounted
// for — completed, canceled by its client, or failed with a counted status
// or reason — none may hang, and goroutines and heap must come back to
// their baseline afterwards.
//
// CI runs the short form (go test -race ./...). A long run:
//
//	nice -n 19 go test -run Soak -timeout 30m ./cmd/gpurouter/ -soak.duration 10m -soak.streams 2000 -v

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

var (
	soakDuration = flag.Duration("soak.duration", 60*time.Second, "soak: how long clients keep sending")
	soakStreams  = flag.Int("soak.streams", 500, "soak: concurrent clients, each sending one request after another")
	soakSpeed    = flag.Float64("soak.speed", 0.1, "soak: speed of the simulated engines (1 = the tinyllama profile's own), keeping the event rate within what -race on 2 cores relays")
	soakHeap     = flag.String("soak.heapprofile", "", "soak: write a heap profile here once the run is over and resources have settled")
	soakSeed     = flag.Int64("soak.seed", 1, "soak: draws which replicas get which real-engine fault")
)

var soakOutcomes = []string{"ok", "migrated", "canceled", "client_error", "no_replica", "shed", "upstream_error", "broken_stream", "timeout", "shutdown"}

// soakAccount is the client side's tally.
type soakAccount struct {
	mu        sync.Mutex
	sent      int
	completed int
	canceled  int            // hung up on purpose
	failed    map[string]int // status or reason → count
	hung      int            // no end within the bound
	durations []time.Duration
}

func (a *soakAccount) add(kind, reason string, d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.durations = append(a.durations, d)
	switch kind {
	case "completed":
		a.completed++
	case "canceled":
		a.canceled++
	case "hung":
		a.hung++
	default:
		a.failed[reason]++
	}
}

func (a *soakAccount) failures() int {
	n := 0
	for _, c := range a.failed {
		n += c
	}
	return n
}

type soakResources struct {
	goroutines int
	heap       uint64
}

func measure() soakResources {
	runtime.GC()
	runtime.GC() // a second cycle empties the sync.Pools the first one moved to their victim caches
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return soakResources{goroutines: runtime.NumGoroutine(), heap: ms.HeapAlloc}
}

func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: skipped with -short")
	}
	duration, streams := *soakDuration, *soakStreams
	const replicas = 4
	faults := make([]sim.Faults, replicas)
	for i := range faults {
		faults[i].Speed = *soakSpeed
	}
	// Behaviours of real engines, each on a replica drawn at random (r1,
	// the one killed mid-run, aside): one closes every connection after
	// its response while advertising keep-alive (llama.cpp's server), one
	// answers 429 + Retry-After once its waiting queue holds a few
	// requests (vLLM-compatible servers' max waiting queue length).
	draw := rand.New(rand.NewPCG(uint64(*soakSeed), 7))
	others := []int{0, 2, 3}
	draw.Shuffle(len(others), func(i, j int) { others[i], others[j] = others[j], others[i] })
	faults[others[0]].CloseAfterResponse = true
	faults[others[1]].MaxWaitingQueueLength, faults[others[1]].RetryAfterSeconds = 4, 1
	t.Logf("faults: r%d closes after every response, r%d refuses past 4 waiting (Retry-After: 1), r1 is killed mid-run", others[0], others[1])
	fleet := startSimFleet(t, replicas, faults)
	cfg := faultConfig(fleet.URLs(), "least_loaded")
	// Probes as deployed (1 s timeout): on a loaded box a tighter one marks
	// busy replicas down.
	cfg.Health = healthConfig{Interval: 500 * time.Millisecond, Timeout: time.Second}
	cfg.Telemetry.Interval = 100 * time.Millisecond
	cfg.Breaker.OpenTimeout = 2 * time.Second
	// Warnings only: replicas marked unhealthy, counted in the report.
	core, logs := observer.New(zapcore.WarnLevel)
	tr := startTestRouter(t, cfg, zap.New(core))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams}}

	// Baseline: everything started and warm, no request in flight.
	for i := 0; i < 8; i++ {
		if v := post(context.Background(), client, tr.base, chatRequest(true, 4), nil); !v.done {
			t.Fatalf("warm-up: %+v", v)
		}
	}
	client.CloseIdleConnections()
	tr.waitIdle(10 * time.Second)
	// Tests run before this one in the binary may still be winding down
	// (fasthttp's idle workers, keep-alive connections): let the count
	// settle before it becomes the baseline (bounded).
	base := measure()
	for settle := time.Now().Add(15 * time.Second); time.Now().Before(settle); {
		time.Sleep(500 * time.Millisecond)
		m := measure()
		if m.goroutines >= base.goroutines {
			base = m
			break
		}
		base = m
	}
	warmup := map[string]int{"": tr.requests()}
	for _, o := range soakOutcomes {
		warmup[o] = tr.requests("outcome", o)
	}

	acct := &soakAccount{failed: map[string]int{}}
	// A request still open after this is hung: the longest ones take tens
	// of seconds when the fleet is loaded (a stream gets a few tokens a
	// second at the default speed), so the bound is generous, not tight.
	bound := 3*time.Minute + duration/10
	end := time.Now().Add(duration)
	var wg sync.WaitGroup
	for w := 0; w < streams; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for time.Now().Before(end) {
				soakOne(client, tr.base, rng, bound, acct)
			}
		}()
	}

	// Kill one replica a third into the run and bring it back a sixth of
	// the run later; it must be serving again before the end.
	victim := fleet.Replicas()[1]
	time.Sleep(duration / 3) // the schedule of the run, not synchronisation
	down := min(duration/6, 20*time.Second)
	r1 := tr.replicas()["r1"]
	servedBefore := r1.Served
	victim.Crash(down)
	t.Logf("r1 crashed at %v for %v (had served %d, %d in flight)", duration/3, down, servedBefore, r1.InFlight)
	wg.Wait()
	ran := time.Since(end) + duration
	servedAfter := tr.replicas()["r1"].Served

	// Everything ends: the router holds nothing, the engines run nothing.
	client.CloseIdleConnections()
	tr.waitIdle(30 * time.Second)
	eventually(t, 30*time.Second, "an engine kept running sequences after every client was done", func() bool {
		for _, r := range fleet.Replicas() {
			if s := r.State(); s.Running+s.Waiting > 0 {
				return false
			}
		}
		return true
	})

	// Accounting, client side and router side.
	a := acct
	reasons := make([]string, 0, len(a.failed))
	for r, n := range a.failed {
		reasons = append(reasons, fmt.Sprintf("%s=%d", r, n))
	}
	sort.Strings(reasons)
	outcomes := map[string]int{}
	for _, o := range soakOutcomes {
		if n := tr.requests("outcome", o) - warmup[o]; n > 0 {
			outcomes[o] = n
		}
	}
	routerTotal := tr.requests() - warmup[""]
	failedOn := map[string]string{} // replica → its failed outcomes
	for name := range tr.replicas() {
		var parts []string
		for _, o := range []string{"broken_stream", "timeout", "upstream_error"} {
			if n := tr.requests("replica", name, "outcome", o); n > 0 {
				parts = append(parts, fmt.Sprintf("%s=%d", o, n))
			}
		}
		failedOn[name] = strings.Join(parts, " ")
	}
	unhealthy := map[string]int{}
	for _, e := range logs.FilterMessage("replica unhealthy").All() {
		unhealthy[fmt.Sprint(e.ContextMap()["replica"])]++
	}
	t.Logf("soak: %d streams for %v (ran %v), engine speed %.2f", streams, duration, ran.Round(time.Millisecond), *soakSpeed)
	slices.Sort(a.durations)
	pct := func(p float64) time.Duration {
		if len(a.durations) == 0 {
			return 0
		}
		return a.durations[int(p*float64(len(a.durations)-1))].Round(time.Millisecond)
	}
	t.Logf("client: sent %d = completed %d + canceled %d + failed %d + hung %d; failures: %s",
		a.sent, a.completed, a.canceled, a.failures(), a.hung, strings.Join(reasons, " "))
	t.Logf("client: request time p50 %v p99 %v max %v (hung bound %v)", pct(0.5), pct(0.99), pct(1), bound)
	t.Logf("router: recorded %d: %v; failures by replica %v; marked unhealthy %v", routerTotal, outcomes, failedOn, unhealthy)
	t.Logf("r1 killed for %v and restarted: served %d before, %d by the end", down, servedBefore, servedAfter)
	t.Logf("router: %v requests resent after a stale pooled connection; %v engine refusals (429), %v retries in all",
		sumMetric(t, tr.base+"/metrics", "gpurouter_upstream_stale_connections_total"),
		sumMetric(t, tr.base+"/metrics", "gpurouter_retries_total", "reason", "429"),
		sumMetric(t, tr.base+"/metrics", "gpurouter_retries_total"))
	if a.sent != a.completed+a.canceled+a.failures()+a.hung {
		t.Errorf("client accounting does not add up")
	}
	if a.hung != 0 {
		t.Errorf("%d requests hung (no end within %v)", a.hung, bound)
	}
	// Every request reached the router and was recorded once; a client
	// that hangs up early may leave before its request is complete.
	if routerTotal > a.sent || routerTotal < a.sent-a.canceled {
		t.Errorf("router recorded %d requests, clients sent %d (%d canceled)", routerTotal, a.sent, a.canceled)
	}
	// A stream continued on another replica after r1 died is served
	// whole: "migrated" counts with "ok".
	if served := outcomes["ok"] + outcomes["migrated"]; served < a.completed || served > a.completed+a.canceled {
		t.Errorf("router ok+migrated %d, clients completed %d (+%d canceled)", served, a.completed, a.canceled)
	}
	// Every stream r1's death cut could go on elsewhere (migration is on,
	// one move each, and these requests can all be continued): none may
	// end with bad_upstream for it, and none may find no replica to take
	// it. Only a stream that can't be continued may still end so.
	notContinuable := int(sumMetric(t, tr.base+"/metrics", "gpurouter_migrations_total", "result", "not_continuable"))
	if n := sumMetric(t, tr.base+"/metrics", "gpurouter_migrations_total", "result", "failed"); n > 0 {
		t.Errorf("%v streams found no replica to continue on", n)
	}
	if bad := a.failed["event/bad_upstream"]; bad > notContinuable {
		t.Errorf("%d streams ended with bad_upstream, %d of them could not be continued", bad, notContinuable)
	}
	t.Logf("migration: %d streams moved (%v), %d could not be continued, %v clients left while theirs moved",
		outcomes["migrated"], sumMetric(t, tr.base+"/metrics", "gpurouter_migrations_total", "result", "continued"), notContinuable,
		sumMetric(t, tr.base+"/metrics", "gpurouter_migrations_total", "result", "abandoned"))
	// Every failure is a clear one: an OpenAI error with a status and a
	// code, or an error event with a code before [DONE] — never a dropped
	// connection, a stream without [DONE] or an unreadable answer. Sheds
	// (429) are the router refusing work beyond its queue, by design when
	// clients outnumber engine slots plus queue (2,000 streams with a
	// replica down); the rest is what the crash cut, and on a starved box
	// what timeouts and health checks cut (see the step lag below).
	shed := 0
	for reason, n := range a.failed {
		status, code, _ := strings.Cut(reason, "/")
		switch {
		case status == "429":
			shed += n
		case code == "" || code == "unparsable" || (status != "event" && !strings.HasPrefix(status, "5")):
			t.Errorf("%d requests failed unclearly: %s", n, reason)
		}
	}
	// A stale pooled connection, an engine's refusal and a dead replica
	// are the router's to absorb: none may reach a client as a 502.
	for reason, n := range a.failed {
		if strings.HasPrefix(reason, "502/") {
			t.Errorf("%d requests got 502 (%s): a stale connection, a refusal or a dead replica leaked to the client", n, reason)
		}
	}
	if a.completed < (a.sent-shed)/2 {
		t.Errorf("only %d of %d requests (%d shed) completed", a.completed, a.sent, shed)
	}
	var lags []string
	for i, r := range fleet.Replicas() {
		l := r.StepLag()
		lags = append(lags, fmt.Sprintf("r%d p99 %v max %v", i, l.P99.Round(time.Millisecond), l.Max.Round(time.Millisecond)))
	}
	t.Logf("failures besides sheds: %d (r1 had %d requests in flight when it crashed); simulator step lag: %s",
		a.failures()-shed, r1.InFlight, strings.Join(lags, ", "))
	if servedAfter <= servedBefore {
		t.Errorf("r1 served nothing after its restart")
	}

	// Resources: back to the baseline once fasthttp's idle connections
	// and workers have been cleaned up (bounded wait).
	var after soakResources
	settled := time.Now().Add(30 * time.Second)
	for {
		after = measure()
		if after.goroutines <= base.goroutines+base.goroutines/10+10 || time.Now().After(settled) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if *soakHeap != "" {
		f, err := os.Create(*soakHeap)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.WriteHeapProfile(f); err != nil {
			t.Error(err)
		}
		f.Close()
	}
	t.Logf("resources: goroutines %d → %d, heap %.1f MiB → %.1f MiB",
		base.goroutines, after.goroutines, float64(base.heap)/(1<<20), float64(after.heap)/(1<<20))
	if after.goroutines > base.goroutines+base.goroutines/10+10 {
		t.Errorf("goroutines did not return to baseline: %d → %d", base.goroutines, after.goroutines)
	}
	// The in-process simulator keeps two minutes of each replica's /metrics
	// text (for stale_metrics_seconds): it fills during the run by design.
	// Beyond it, allow the runtime's kept goroutine descriptors (never
	// freed) and fixed-size rings filling: a router leaking per request
	// would exceed this over a long run.
	simHistory := uint64(replicas) * 121 * uint64(metricsSize(t, fleet.URLs()[0])) * 3 / 2
	allowed := base.heap + base.heap/4 + simHistory + uint64(streams)*4<<10 + 16<<20 // goroutine descriptors scale with streams
	t.Logf("resources: heap allowance %.1f MiB (of it the simulator's metrics history ≤ %.1f MiB)", float64(allowed)/(1<<20), float64(simHistory)/(1<<20))
	if after.heap > allowed {
		t.Errorf("heap did not return near baseline: %d → %d bytes (allowed %d)", base.heap, after.heap, allowed)
	}
}

// soakOne sends one request — usually a stream, sometimes not — and
// classifies how it ended. About one in ten is hung up on: mid-stream or
// after a short random delay.
func soakOne(c *http.Client, base string, rng *rand.Rand, bound time.Duration, a *soakAccount) {
	stream := rng.IntN(10) != 0
	maxTokens := 8 + rng.IntN(57)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var hangUp atomic.Bool
	stopAfter := 0
	switch rng.IntN(20) {
	case 0:
		stopAfter = 1 + rng.IntN(maxTokens/2)
	case 1:
		delay := time.Duration(rng.IntN(500)) * time.Millisecond
		t := time.AfterFunc(delay, func() { hangUp.Store(true); cancel() })
		defer t.Stop()
	}
	a.mu.Lock()
	a.sent++
	a.mu.Unlock()
	v := post(ctx, c, base, chatRequest(stream, maxTokens), func(v *clientView) bool {
		if stopAfter > 0 && v.events >= stopAfter {
			hangUp.Store(true)
			return false
		}
		return true
	})
	switch {
	case hangUp.Load():
		a.add("canceled", "", v.duration)
	case errors.Is(v.err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		a.add("hung", "", v.duration)
	case v.err != nil:
		a.add("failed", "transport/"+v.err.Error(), v.duration)
	case v.status != 200:
		code, _ := errorCode(v.body)
		a.add("failed", fmt.Sprintf("%d/%s", v.status, code), v.duration)
		if v.status == http.StatusTooManyRequests || v.status == http.StatusServiceUnavailable {
			// As a client should: wait as told (here at most 2 s) before
			// the next request, rather than spin on refusals.
			time.Sleep(min(v.retryAfter, 2*time.Second))
		}
	case stream && !v.done:
		a.add("failed", "no [DONE]/"+v.errCode, v.duration) // not a clear failure
	case v.errCode != "":
		a.add("failed", "event/"+v.errCode, v.duration)
	default:
		a.add("completed", "", v.duration)
	}
}

// metricsSize is the length of one replica's /metrics document.
func metricsSize(t *testing.T, url string) int {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}
