package main

// Fault-matrix rows for behaviours of engines nobody here wrote, played
// by the simulator: connections closed after every response despite
// keep-alive (llama.cpp's server), 429 + Retry-After from a full queue,
// and death between requests with pooled connections open.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
)

func TestFaultUpstreamClosesAfterEveryResponse(t *testing.T) {
	// Each close lags its answer by 2 ms, as a FIN across a network does:
	// on loopback a router that polls quickly sees an immediate close
	// before it reuses the connection, and would never meet a stale one.
	closing := sim.Faults{CloseAfterResponse: true, CloseLagSeconds: 0.002}
	fleet := startSimFleet(t, 2, []sim.Faults{closing, closing})
	cfg := faultConfig(fleet.URLs(), "least_loaded")
	cfg.Breaker = breakerConfig{ConsecutiveFailures: 1, OpenTimeout: time.Minute} // one failure would show
	tr := startTestRouter(t, cfg, nil)
	check := func(what string, v clientView) {
		t.Helper()
		if v.err != nil || v.status != 200 || (v.events > 0 && (!v.done || v.errCode != "")) {
			t.Fatalf("%s: %+v", what, v)
		}
	}
	for i := range 100 {
		check(fmt.Sprintf("sequential %d", i), post(context.Background(), http.DefaultClient, tr.base, chatRequest(i%2 == 1, 4), nil))
	}
	for b := range 13 {
		for i, v := range concurrently(8, 0, func(i int) clientView {
			return post(context.Background(), http.DefaultClient, tr.base, chatRequest(i%2 == 1, 4), nil)
		}) {
			check(fmt.Sprintf("batch %d #%d", b, i), v)
		}
	}
	if n := tr.requests("outcome", "ok"); n != 204 {
		t.Errorf("router recorded %d ok requests, want 204", n)
	}
	if n := sumMetric(t, tr.base+"/metrics", "gpurouter_retries_total"); n != 0 {
		t.Errorf("%v retries: a stale connection is resent on another, not retried", n)
	}
	if n := sumMetric(t, tr.base+"/metrics", "gpurouter_upstream_stale_connections_total"); n == 0 {
		t.Error("no request met a closed pooled connection: the row exercised nothing")
	}
	for name, r := range tr.replicas() {
		if r.Breaker != "closed" || !r.Healthy {
			t.Errorf("%s: breaker %s healthy %v", name, r.Breaker, r.Healthy)
		}
	}
}

func TestFaultEngineRefusesWithRetryAfter(t *testing.T) {
	refuse := sim.Faults{RateLimited: true, RetryAfterSeconds: 7}
	t.Run("every replica refuses", func(t *testing.T) {
		fleet := startSimFleet(t, 2, []sim.Faults{refuse, refuse})
		tr := startTestRouter(t, faultConfig(fleet.URLs(), "round_robin"), nil)
		v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(true, 4), nil)
		code, _ := errorCode(v.body)
		if v.status != 429 || v.retryAfter != 7*time.Second || code != "engine_overloaded" || strings.Contains(v.body, "fasthttp") {
			t.Fatalf("client saw %+v, want 429 engine_overloaded with Retry-After: 7", v)
		}
		for name, r := range tr.replicas() {
			if r.Breaker != "closed" || !r.Healthy {
				t.Errorf("%s: breaker %s healthy %v: a refusal is no failure", name, r.Breaker, r.Healthy)
			}
		}
	})
	t.Run("a replica with room serves", func(t *testing.T) {
		fleet := startSimFleet(t, 3, []sim.Faults{refuse, refuse})
		tr := startTestRouter(t, faultConfig(fleet.URLs(), "round_robin"), nil)
		for i := range 12 {
			v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(i%2 == 0, 4), nil)
			if v.status != 200 || v.replica != "r2" || (v.events > 0 && !v.done) {
				t.Fatalf("request %d: %+v, want 200 from r2", i, v)
			}
		}
		// Each refusing replica was asked once, then rested for 7 s.
		if n := sumMetric(t, tr.base+"/metrics", "gpurouter_retries_total", "reason", "429"); n > 2 {
			t.Errorf("%v refusals: the refusing replicas were asked again during their Retry-After", n)
		}
	})
}

func TestFaultReplicasKilledBetweenRequests(t *testing.T) {
	fleet := startSimFleet(t, 2, nil)
	cfg := faultConfig(fleet.URLs(), "round_robin")
	cfg.Health.Interval = time.Hour // only the traffic itself can tell: no health check runs in time
	tr := startTestRouter(t, cfg, nil)
	for i := range 6 { // pooled keep-alive connections to both replicas
		if v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(i%2 == 0, 4), nil); v.status != 200 {
			t.Fatalf("warm-up %d: %+v", i, v)
		}
	}
	for _, r := range fleet.Replicas() {
		r.Crash(time.Minute) // as kill -9: listener gone, connections reset
	}
	for i := range 10 {
		v := post(context.Background(), http.DefaultClient, tr.base, chatRequest(i%2 == 0, 4), nil)
		code, _ := errorCode(v.body)
		if v.status != 503 || code != "no_healthy_replica" || v.retryAfter == 0 || strings.Contains(v.body, "fasthttp") {
			t.Fatalf("request %d after the kill: %+v, want 503 no_healthy_replica with Retry-After", i, v)
		}
		t.Logf("request %d: 503 in %v", i, v.duration)
	}
	if n := tr.requests("status", "502"); n != 0 {
		t.Errorf("%d requests got 502", n)
	}
	for name, r := range tr.replicas() {
		if r.Healthy || r.Breaker != "closed" {
			t.Errorf("%s: healthy %v breaker %s; want marked down by the refused connection, breaker untouched", name, r.Healthy, r.Breaker)
		}
	}
}
