package main

// The fault matrix: each row drives one failure of the simulated fleet
// (or, where the simulator can't produce it, of a small stand-in) through
// a configured router, and asserts what the client saw and what the
// router recorded: /metrics outcomes, /debug/pools health and breakers,
// and its own counters. Rows take seconds; waits are bounded polls for an
// effect, never sleeps standing in for synchronisation.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
)

// faultConfig is one pool over urls (replicas r0, r1, ...) with health
// checks and telemetry fast enough for a row to take seconds.
func faultConfig(urls []string, policy string) fileConfig {
	pc := poolConfig{Model: "m", Policy: policy}
	for i, u := range urls {
		pc.Replicas = append(pc.Replicas, replicaConfig{URL: u, Name: fmt.Sprintf("r%d", i)})
	}
	return fileConfig{
		Log:       logConfig{Level: "error"},
		Health:    healthConfig{Interval: 50 * time.Millisecond, Timeout: 200 * time.Millisecond},
		Telemetry: telemetryConfig{Interval: 50 * time.Millisecond},
		Pools:     []poolConfig{pc},
	}
}

// concurrently runs n clients, the i-th sending body(i), and returns what
// each saw; spacing paces arrivals like traffic (0: all at once).
func concurrently(n int, spacing time.Duration, send func(i int) clientView) []clientView {
	views := make([]clientView, n)
	var wg sync.WaitGroup
	for i := range views {
		wg.Add(1)
		go func() {
			defer wg.Done()
			views[i] = send(i)
		}()
		if spacing > 0 {
			time.Sleep(spacing) // arrival pacing, not synchronisation
		}
	}
	wg.Wait()
	return views
}

func byReplica(views []clientView) map[string]int {
	out := map[string]int{}
	for _, v := range views {
		out[v.replica]++
	}
	return out
}

// A replica that crashes under live streams, with migration off: its
// clients get an error event and [DONE] (the status line was long sent),
// the router records broken streams, opens the replica's breaker, and
// sends new traffic to the other replica. (With migration on, the default,
// the streams go on elsewhere: migration_test.go.)
func TestFaultReplicaCrashMidStream(t *testing.T) {
	fleet := startSimFleet(t, 2, nil)
	cfg := faultConfig(fleet.URLs(), "round_robin")
	cfg.Breaker = breakerConfig{ConsecutiveFailures: 3, OpenTimeout: time.Minute}
	off := 0
	cfg.Pools[0].Migration.Max = &off
	tr := startTestRouter(t, cfg, nil)

	const streams = 8
	var started sync.WaitGroup
	started.Add(streams)
	crashed := make(chan struct{})
	go func() {
		started.Wait()
		fleet.Replicas()[0].Crash(time.Minute)
		close(crashed)
	}()
	views := concurrently(streams, 0, func(int) clientView {
		first := true
		v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(true, 400), func(*clientView) bool {
			if first {
				first = false
				started.Done()
				<-crashed // read on only once every stream is running and r0 is down
			}
			return true
		})
		if first {
			started.Done()
		}
		return v
	})
	onR0 := 0
	for i, v := range views {
		switch v.replica {
		case "r0":
			onR0++
			if v.status != 200 || v.errCode != "bad_upstream" || !v.done {
				t.Errorf("stream %d on the crashed replica: %+v, want an error event (bad_upstream) and [DONE]", i, v)
			}
		case "r1":
			if v.status != 200 || v.errCode != "" || !v.done {
				t.Errorf("stream %d on the healthy replica: %+v, want a clean stream", i, v)
			}
		default:
			t.Errorf("stream %d: %+v", i, v)
		}
	}
	if onR0 < 3 {
		t.Fatalf("%d of %d streams on r0: round_robin should have put half there", onR0, streams)
	}
	if n := tr.requests("replica", "r0", "outcome", "broken_stream"); n != onR0 {
		t.Errorf("router recorded %d broken streams on r0, want %d", n, onR0)
	}
	eventually(t, 5*time.Second, "r0's breaker never opened, or its health never failed", func() bool {
		r0 := tr.replicas()["r0"]
		return r0.Breaker == "open" && !r0.Healthy
	})
	for i := 0; i < 6; i++ {
		if v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(false, 4), nil); v.status != 200 || v.replica != "r1" {
			t.Fatalf("request %d after the crash: %+v, want 200 from r1", i, v)
		}
	}
	if n, want := tr.requests("replica", "r1", "outcome", "ok"), streams-onR0+6; n != want {
		t.Errorf("router recorded %d ok requests on r1, want %d", n, want)
	}
}

// A hung replica (accepts, never answers) costs first_byte and a retry on
// another replica — nothing was sent to the client yet — and only when
// every replica hangs does the client get a 504.
func TestFaultReplicaHangRetriedElsewhere(t *testing.T) {
	const firstByte = 300 * time.Millisecond
	t.Run("one replica hangs", func(t *testing.T) {
		fleet := startSimFleet(t, 2, []sim.Faults{{Hang: true}})
		cfg := faultConfig(fleet.URLs(), "round_robin")
		cfg.Timeouts.FirstByte = firstByte
		cfg.Breaker.ConsecutiveFailures = 100 // keep r0 in rotation: every pick of it is a retry
		tr := startTestRouter(t, cfg, nil)
		const n = 6
		took := map[string]time.Duration{} // request id → what the client waited
		for i := 0; i < n; i++ {
			stream := i%2 == 0
			v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(stream, 8), nil)
			if v.status != 200 || v.replica != "r1" || v.errCode != "" || (stream && !v.done) {
				t.Fatalf("request %d: %+v, want a clean answer from r1", i, v)
			}
			took[v.id] = v.duration
		}
		var recs struct {
			Records []struct {
				ID       string `json:"request_id"`
				Attempts int
			}
		}
		getJSON(t, tr.base+"/debug/requests", &recs)
		retried := 0
		for _, r := range recs.Records {
			if r.Attempts == 2 {
				retried++
				if took[r.ID] < firstByte {
					t.Errorf("request %s was retried after %v, before first_byte (%v) passed", r.ID, took[r.ID], firstByte)
				}
			}
		}
		if retried == 0 {
			t.Fatal("no request went to the hung replica first: the row tested nothing")
		}
		if got := int(sumMetric(t, tr.base+"/metrics", "gpurouter_retries_total", "reason", "timeout")); got != retried {
			t.Errorf("router counted %d first-byte timeout retries, its records %d", got, retried)
		}
		if n := tr.requests("outcome", "ok"); n != len(took) {
			t.Errorf("router recorded %d ok requests, want %d", n, len(took))
		}
	})
	t.Run("every replica hangs", func(t *testing.T) {
		fleet := startSimFleet(t, 2, []sim.Faults{{Hang: true}, {Hang: true}})
		cfg := faultConfig(fleet.URLs(), "round_robin")
		cfg.Timeouts.FirstByte = firstByte
		cfg.Retry.MaxAttempts = 2
		tr := startTestRouter(t, cfg, nil)
		v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(false, 8), nil)
		if code, _ := errorCode(v.body); v.status != 504 || code != "upstream_timeout" {
			t.Fatalf("client saw %+v, want 504 upstream_timeout", v)
		}
		if v.duration < 2*firstByte || v.duration > 2*firstByte+time.Second {
			t.Fatalf("504 after %v, want 2 attempts × first_byte (%v)", v.duration, 2*firstByte)
		}
		if n := tr.requests("outcome", "timeout"); n != 1 {
			t.Fatalf("router recorded %d timeouts, want 1", n)
		}
	})
}

// A slow replica (a quarter of the speed) is routed around by least_loaded:
// its requests stay longer, its engine reports more running, and it gets
// less of a steady stream of arrivals.
func TestFaultSlowReplicaRoutedAround(t *testing.T) {
	fleet := startSimFleet(t, 2, []sim.Faults{{Speed: 0.25}})
	tr := startTestRouter(t, faultConfig(fleet.URLs(), "least_loaded"), nil)
	eventually(t, 5*time.Second, "no engine telemetry", func() bool {
		reps := tr.replicas()
		return reps["r0"].Engine != nil && reps["r1"].Engine != nil
	})
	views := concurrently(60, 40*time.Millisecond, func(int) clientView {
		return post(context.Background(), http.DefaultClient, tr.base, chatRequest(true, 100), nil)
	})
	counts := byReplica(views)
	t.Logf("requests per replica: %v", counts)
	for i, v := range views {
		if v.status != 200 || !v.done || v.errCode != "" {
			t.Fatalf("request %d: %+v", i, v)
		}
	}
	// An even split would be 30/30; Little's law with equal load puts a
	// fifth of the arrivals on a replica 4× slower. Allow wide margin.
	if 10*counts["r0"] > 4*len(views) {
		t.Fatalf("the slow replica got %d of %d requests: want clearly less than an even split (at most 40%%)", counts["r0"], len(views))
	}
	for name, n := range counts {
		if got := tr.requests("replica", name, "outcome", "ok"); got != n {
			t.Errorf("router recorded %d ok requests on %s, clients saw %d", got, name, n)
		}
	}
}

// All replicas down: the client gets a 503 naming the cause at once — not
// after a first-byte timeout, and not after waiting in the admission queue
// for a replica to come back.
func TestFaultAllReplicasDown503Fast(t *testing.T) {
	const firstByte = 5 * time.Second
	tests := []struct {
		name   string
		faults sim.Faults
		crash  bool
	}{
		{"crashed", sim.Faults{}, true},
		{"engine dead", sim.Faults{Dead: true}, false},
		{"wedged (hang_all)", sim.Faults{HangAll: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fleet := startSimFleet(t, 2, nil)
			cfg := faultConfig(fleet.URLs(), "least_loaded")
			cfg.Timeouts.FirstByte = firstByte
			tr := startTestRouter(t, cfg, nil)
			for _, rep := range fleet.Replicas() {
				if tt.crash {
					rep.Crash(time.Minute)
				} else if err := rep.SetFaults(tt.faults); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, 5*time.Second, "the health checker never marked both replicas down", func() bool {
				reps := tr.replicas()
				return !reps["r0"].Healthy && !reps["r1"].Healthy
			})
			for _, stream := range []bool{false, true} {
				v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(stream, 8), nil)
				code, _ := errorCode(v.body)
				if v.status != 503 || code != "no_healthy_replica" || !strings.Contains(v.body, `no healthy replica for model \"m\"`) {
					t.Fatalf("client saw %+v, want 503 no_healthy_replica naming the model", v)
				}
				if v.duration > firstByte/10 {
					t.Fatalf("503 took %v, want well under first_byte (%v)", v.duration, firstByte)
				}
			}
			if n := tr.requests("outcome", "no_replica"); n != 2 {
				t.Fatalf("router recorded %d no_replica requests, want 2", n)
			}
			resp, err := http.Get(tr.base + "/ready")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 503 {
				t.Fatalf("/ready answered %d with every replica down", resp.StatusCode)
			}
			tr.waitIdle(time.Second)
		})
	}
}

// Requests waiting in the admission queue when the last replica goes down
// get the same 503 as requests arriving after it: nothing drains that queue
// until a replica returns, so holding them would be a hang. Streams already
// running on the replicas are not touched. "At once" is checked by order,
// not by a stopwatch: every queued request is answered while both long
// streams still hold their replicas. Without the flush the queue would only
// move when a stream ended and freed its budget.
func TestFaultAllReplicasDownFlushesAdmissionQueue(t *testing.T) {
	fleet := startSimFleet(t, 2, nil)
	cfg := faultConfig(fleet.URLs(), "least_loaded")
	// A token budget of 0.1% of the KV cache: one long stream saturates a
	// replica, so later requests wait at the router.
	cfg.Admission.Saturation.TokenBudgetRatio = 0.001
	tr := startTestRouter(t, cfg, nil)
	eventually(t, 5*time.Second, "the engines never reported their KV capacity", func() bool {
		for _, r := range tr.replicas() {
			if r.Engine == nil || r.Engine.KVCapacityTokens == 0 {
				return false
			}
		}
		return true
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holders := make(chan clientView, 2)
	for range 2 {
		go func() { holders <- post(ctx, http.DefaultClient, tr.base, chatRequest(true, 1500), nil) }()
	}
	eventually(t, 5*time.Second, "the long streams did not take one replica each", func() bool {
		reps := tr.replicas()
		return reps["r0"].InFlight == 1 && reps["r1"].InFlight == 1
	})
	queued := make(chan clientView, 3)
	for range 3 {
		go func() { queued <- post(ctx, http.DefaultClient, tr.base, chatRequest(false, 8), nil) }()
	}
	eventually(t, 5*time.Second, "requests did not wait in the admission queue", func() bool {
		return sumMetric(t, tr.base+"/metrics", "gpurouter_admission_queue_depth") == 3
	})

	for _, rep := range fleet.Replicas() {
		if err := rep.SetFaults(sim.Faults{Health: "fail"}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "the health checker never marked both replicas down", func() bool {
		reps := tr.replicas()
		return !reps["r0"].Healthy && !reps["r1"].Healthy
	})
	for range 3 {
		select {
		case v := <-queued:
			if code, _ := errorCode(v.body); v.status != 503 || code != "no_healthy_replica" {
				t.Fatalf("queued client saw %+v, want 503 no_healthy_replica", v)
			}
		case v := <-holders:
			t.Fatalf("a long stream ended (%+v) before every queued request was answered: the queue waited for capacity instead of being flushed", v)
		}
	}
	if reps := tr.replicas(); reps["r0"].InFlight != 1 || reps["r1"].InFlight != 1 {
		t.Fatalf("the running streams were disturbed: %+v", reps)
	}
	cancel()
	for range 2 {
		<-holders
	}
	tr.waitIdle(5 * time.Second)
}

// Clients that hang up at random points — while queued at the router,
// during prefill, mid-stream, during a non-streamed generation — leave
// nothing behind: every engine sequence is aborted (the simulator's
// running, waiting and KV usage return to 0), and the router's in-flight,
// active and admission-queue counts return to 0, each request recorded
// as canceled.
func TestFaultClientDisconnectAbortsUpstream(t *testing.T) {
	fleet := startSimFleet(t, 2, nil)
	cfg := faultConfig(fleet.URLs(), "least_loaded")
	// The rest wait in the admission queue. Few enough that some of the
	// clients that hang up after a delay are still queued then, whichever
	// requests the router admits first: with six, the request loops (which
	// take whole requests at once, streams after a hand-off) sometimes
	// admitted every such client before it left.
	cfg.Admission.MaxInFlight = 3
	tr := startTestRouter(t, cfg, nil)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()

	type plan struct {
		stream    bool
		stopAfter int           // stream events read before hanging up; 0: hang up after delay
		delay     time.Duration // for stopAfter 0
	}
	rng := rand.New(rand.NewPCG(7, 11))
	plans := make([]plan, 40)
	for i := range plans {
		plans[i] = plan{stream: rng.IntN(4) != 0, stopAfter: rng.IntN(40), delay: time.Duration(20+rng.IntN(400)) * time.Millisecond}
		if !plans[i].stream {
			plans[i].stopAfter = 0
		}
	}
	views := concurrently(len(plans), 0, func(i int) clientView {
		p := plans[i]
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if p.stopAfter == 0 {
			time.AfterFunc(p.delay, cancel)
		}
		return post(ctx, client, tr.base, chatRequest(p.stream, 1500), func(v *clientView) bool { return v.events < p.stopAfter })
	})
	for i, v := range views {
		if v.done {
			t.Fatalf("request %d ran to the end: the test hangs up on every one (%+v)", i, v)
		}
	}
	eventually(t, 10*time.Second, "an engine kept a sequence whose client had gone", func() bool {
		for _, u := range fleet.URLs() {
			if sumMetric(t, u+"/metrics", "vllm:num_requests_running")+sumMetric(t, u+"/metrics", "vllm:num_requests_waiting") > 0 ||
				sumMetric(t, u+"/metrics", "vllm:kv_cache_usage_perc") > 0 {
				return false
			}
		}
		return true
	})
	tr.waitIdle(5 * time.Second)
	if n := sumMetric(t, tr.base+"/metrics", "gpurouter_replica_in_flight_requests") + sumMetric(t, tr.base+"/metrics", "gpurouter_admission_queue_depth"); n != 0 {
		t.Fatalf("router /metrics still shows %v requests in flight or queued", n)
	}
	if total, canceled := tr.requests(), tr.requests("outcome", "canceled"); total != len(plans) || canceled != total {
		var recs struct {
			Records []struct {
				Outcome          string
				Status           int
				Stream           bool
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		getJSON(t, tr.base+"/debug/requests", &recs)
		t.Logf("%+v", recs)
		t.Fatalf("router recorded %d requests, %d canceled; want %d, all canceled", total, canceled, len(plans))
	}
	if n := sumMetric(t, tr.base+"/metrics", "gpurouter_admission_canceled_total"); n == 0 {
		t.Error("no client left the admission queue: the row did not cover queued requests")
	}
}
