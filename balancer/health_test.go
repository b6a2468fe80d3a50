package balancer_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

var errProbe = errors.New("probe failed")

// fakeProber answers each replica's probes from a script, one entry per
// round, and then keeps answering with the script's last entry. CheckOnce
// probes replicas concurrently, hence the mutex.
type fakeProber struct {
	mu     sync.Mutex
	script map[string][]error // by replica name
	calls  map[string]int
	// probed, when set, receives each replica's name after its probe.
	probed chan string
}

func newFakeProber(script map[string][]error) *fakeProber {
	return &fakeProber{script: script, calls: make(map[string]int)}
}

func (f *fakeProber) Probe(_ context.Context, r *balancer.Replica) error {
	f.mu.Lock()
	s := f.script[r.Name()]
	i := f.calls[r.Name()]
	f.calls[r.Name()]++
	f.mu.Unlock()
	if f.probed != nil {
		defer func() { f.probed <- r.Name() }()
	}
	switch {
	case len(s) == 0:
		return nil
	case i < len(s):
		return s[i]
	default:
		return s[len(s)-1]
	}
}

func (f *fakeProber) callCount(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

// S and F make the health scripts below readable: one letter per round.
var (
	S error
	F = errProbe
)

func TestHealthCheckerThresholds(t *testing.T) {
	tests := []struct {
		name      string
		cfg       balancer.HealthConfig
		startDown bool
		rounds    []error // probe result per round
		want      []bool  // Healthy() after each round
	}{
		{
			name:   "defaults: down after 2 failures, up after 1 success",
			rounds: []error{F, F, S},
			want:   []bool{true, false, true},
		},
		{
			name:   "single failures between successes don't flip",
			rounds: []error{S, F, S, F, S, F, S},
			want:   []bool{true, true, true, true, true, true, true},
		},
		{
			name:   "three to go down",
			cfg:    balancer.HealthConfig{UnhealthyThreshold: 3},
			rounds: []error{F, F, S, F, F, F},
			want:   []bool{true, true, true, true, true, false},
		},
		{
			name:   "one to go down",
			cfg:    balancer.HealthConfig{UnhealthyThreshold: 1},
			rounds: []error{S, F, S},
			want:   []bool{true, false, true},
		},
		{
			name:      "recovery needs consecutive successes",
			cfg:       balancer.HealthConfig{HealthyThreshold: 3},
			startDown: true,
			rounds:    []error{S, S, F, S, S, S},
			want:      []bool{false, false, false, false, false, true},
		},
		{
			// A flapping replica that is down stays down, and once up,
			// stays up: no flip per probe in either direction.
			name:   "flapping does not oscillate",
			cfg:    balancer.HealthConfig{UnhealthyThreshold: 2, HealthyThreshold: 2},
			rounds: []error{F, F, S, F, S, F, S, S, F, S, F},
			want:   []bool{true, false, false, false, false, false, false, true, true, true, true},
		},
		{
			name:      "set down by someone else comes back on success",
			startDown: true,
			rounds:    []error{S},
			want:      []bool{true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			r := newReplica(t, "a", c, replicaOpts{down: tc.startDown})
			prober := newFakeProber(map[string][]error{"a": tc.rounds})
			h := balancer.NewHealthChecker(tc.cfg, prober, func() []*balancer.Replica { return []*balancer.Replica{r} }, nil)
			for i := range tc.rounds {
				h.CheckOnce(context.Background())
				if got := r.Healthy(); got != tc.want[i] {
					t.Fatalf("after round %d (%v): healthy %v, want %v", i, tc.rounds[:i+1], got, tc.want[i])
				}
			}
		})
	}
}

// TestHealthCheckerIndependent: replicas keep their own streaks.
func TestHealthCheckerIndependent(t *testing.T) {
	c := newFakeClock()
	rs := []*balancer.Replica{
		newReplica(t, "ok", c, replicaOpts{}),
		newReplica(t, "bad", c, replicaOpts{}),
		newReplica(t, "flaky", c, replicaOpts{}),
	}
	prober := newFakeProber(map[string][]error{
		"ok":    {S},
		"bad":   {F},
		"flaky": {F, S, F, S},
	})
	h := balancer.NewHealthChecker(balancer.HealthConfig{}, prober, func() []*balancer.Replica { return rs }, nil)
	for range 4 {
		h.CheckOnce(context.Background())
	}
	want := map[string]bool{"ok": true, "bad": false, "flaky": true}
	for _, r := range rs {
		if r.Healthy() != want[r.Name()] {
			t.Errorf("%s healthy %v, want %v", r.Name(), r.Healthy(), want[r.Name()])
		}
		if n := prober.callCount(r.Name()); n != 4 {
			t.Errorf("%s probed %d times, want 4", r.Name(), n)
		}
	}
}

// TestHealthCheckerCanceled: a round cut short by shutdown says nothing
// about the replicas, so it neither flips them nor counts toward a streak.
func TestHealthCheckerCanceled(t *testing.T) {
	tests := []struct {
		name      string
		startDown bool
		result    error
	}{
		{name: "failures don't take a replica down", result: F},
		{name: "successes don't bring one up", startDown: true, result: S},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			r := newReplica(t, "a", c, replicaOpts{down: tc.startDown})
			prober := newFakeProber(map[string][]error{"a": {tc.result}})
			h := balancer.NewHealthChecker(balancer.HealthConfig{UnhealthyThreshold: 2, HealthyThreshold: 2},
				prober, func() []*balancer.Replica { return []*balancer.Replica{r} }, nil)
			canceled, cancel := context.WithCancel(context.Background())
			cancel()
			for range 5 {
				h.CheckOnce(canceled)
			}
			if got := r.Healthy(); got != !tc.startDown {
				t.Fatalf("healthy %v after canceled rounds, want %v", got, !tc.startDown)
			}
			// The canceled rounds added nothing to the streak: one live
			// round is still short of the threshold of 2.
			h.CheckOnce(context.Background())
			if got := r.Healthy(); got != !tc.startDown {
				t.Fatalf("healthy %v after 1 live round (threshold 2), want %v", got, !tc.startDown)
			}
			h.CheckOnce(context.Background())
			if got := r.Healthy(); got != tc.startDown {
				t.Fatalf("healthy %v after 2 live rounds, want %v", got, tc.startDown)
			}
		})
	}
}

// TestHealthCheckerReplicaSetChange: a replica that leaves the set loses
// its streak, so coming back it starts counting afresh.
func TestHealthCheckerReplicaSetChange(t *testing.T) {
	c := newFakeClock()
	a := newReplica(t, "a", c, replicaOpts{})
	b := newReplica(t, "b", c, replicaOpts{})
	set := []*balancer.Replica{a, b}
	prober := newFakeProber(map[string][]error{"a": {F}})
	h := balancer.NewHealthChecker(balancer.HealthConfig{}, prober, func() []*balancer.Replica { return set }, nil)

	h.CheckOnce(context.Background()) // a: 1 failure
	set = []*balancer.Replica{b}
	h.CheckOnce(context.Background()) // a not probed
	set = []*balancer.Replica{a, b}
	h.CheckOnce(context.Background()) // a: 1 failure again, not 2
	if !a.Healthy() {
		t.Fatal("a went down on a streak carried across its absence from the set")
	}
	if n := prober.callCount("a"); n != 2 {
		t.Fatalf("a probed %d times, want 2 (not while out of the set)", n)
	}
	h.CheckOnce(context.Background())
	if a.Healthy() {
		t.Fatal("a still healthy after 2 consecutive failures")
	}
}

// blockingProber never answers on its own: only the probe's context ends it.
type blockingProber struct{}

func (blockingProber) Probe(ctx context.Context, _ *balancer.Replica) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestHealthCheckerTimeout: a replica that doesn't answer within Timeout
// counts as failing, and CheckOnce returns instead of hanging on it.
func TestHealthCheckerTimeout(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "a", c, replicaOpts{})
	h := balancer.NewHealthChecker(balancer.HealthConfig{Timeout: time.Millisecond, UnhealthyThreshold: 1},
		blockingProber{}, func() []*balancer.Replica { return []*balancer.Replica{r} }, nil)
	h.CheckOnce(context.Background())
	if r.Healthy() {
		t.Fatal("replica healthy after its probe timed out")
	}
}

// TestHealthCheckerRun: Run probes at once (not only after the first
// Interval) and returns when its context ends.
func TestHealthCheckerRun(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "a", c, replicaOpts{})
	prober := newFakeProber(nil)
	prober.probed = make(chan string, 1)
	h := balancer.NewHealthChecker(balancer.HealthConfig{Interval: time.Hour}, prober,
		func() []*balancer.Replica { return []*balancer.Replica{r} }, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	if got := <-prober.probed; got != "a" {
		t.Fatalf("probed %q, want a", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
}

// --- HTTPProber against real loopback servers ---

func TestHTTPProber(t *testing.T) {
	// vllm answers its /health 200 when the engine lives and 503 when it is
	// dead; anything else is a 404, so probing a wrong path fails.
	healthOn := func(path string, status int) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || r.URL.Path != path {
				http.NotFound(w, r)
				return
			}
			w.WriteHeader(status)
			_, _ = w.Write([]byte("{}"))
		})
	}
	tests := []struct {
		name    string
		handler http.Handler
		closed  bool   // server closed before the probe
		path    string // HTTPProber.Path
		suffix  string // appended to the server URL to form the replica URL
		wantErr string // substring; "" means success
	}{
		{name: "200", handler: healthOn("/health", http.StatusOK)},
		{name: "503", handler: healthOn("/health", http.StatusServiceUnavailable), wantErr: "503"},
		{name: "500", handler: healthOn("/health", http.StatusInternalServerError), wantErr: "500"},
		{name: "closed server", handler: healthOn("/health", http.StatusOK), closed: true, wantErr: "connect"},
		{
			name: "connection dropped",
			handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
			}),
			wantErr: "EOF",
		},
		{name: "custom path", handler: healthOn("/ping", http.StatusOK), path: "/ping"},
		{name: "custom path without slash", handler: healthOn("/ping", http.StatusOK), path: "ping"},
		{name: "wrong path is a failure", handler: healthOn("/ping", http.StatusOK), wantErr: "404"},
		{name: "base URL with trailing slash", handler: healthOn("/health", http.StatusOK), suffix: "/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			r, err := balancer.NewReplica(balancer.ReplicaConfig{Name: "a", URL: srv.URL + tc.suffix}, balancer.BreakerConfig{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.closed {
				srv.Close()
			}
			p := balancer.HTTPProber{Client: srv.Client(), Path: tc.path}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bound only; never reached
			defer cancel()
			err = p.Probe(ctx, r)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Probe: %v, want nil", err)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("Probe succeeded, want an error containing %q", tc.wantErr)
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("Probe: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestHTTPProberContext: the probe gives up when its context ends even if
// the replica never answers (the checker's Timeout relies on this).
func TestHTTPProberContext(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release) // runs before srv.Close, which waits for handlers
	r, err := balancer.NewReplica(balancer.ReplicaConfig{URL: srv.URL}, balancer.BreakerConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- balancer.HTTPProber{}.Probe(ctx, r) }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Probe after cancel: %v, want context.Canceled", err)
	}
}

// TestHTTPProberReusesConnection: successive rounds reuse one keep-alive
// connection instead of dialling the replica every Interval.
func TestHTTPProberReusesConnection(t *testing.T) {
	var mu sync.Mutex
	conns := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// A body the prober doesn't need, as an engine's error page would be.
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(strings.Repeat("x", 512)))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	r, err := balancer.NewReplica(balancer.ReplicaConfig{URL: srv.URL}, balancer.BreakerConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := balancer.HTTPProber{Client: srv.Client()}
	for range 5 {
		if err := p.Probe(context.Background(), r); err == nil {
			t.Fatal("Probe of a 503 succeeded")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if conns != 1 {
		t.Fatalf("%d connections for 5 probes, want 1", conns)
	}
}

// TestHealthCheckerBusyReplica: a probe that times out while the replica's
// traffic shows it alive is inconclusive, so an overloaded fleet whose
// /health answers late is not marked down; the same timeouts without recent
// output, or an outright refusal, still take the replica out.
func TestHealthCheckerBusyReplica(t *testing.T) {
	timeout := context.DeadlineExceeded
	cases := []struct {
		name        string
		probe       error
		streaming   bool // a token arrives before every round
		lastOutput  time.Duration
		busyGrace   time.Duration
		wantHealthy bool
	}{
		{name: "timeouts while streaming", probe: timeout, streaming: true, wantHealthy: true},
		{name: "timeouts, output within the grace", probe: timeout, lastOutput: 3 * time.Second, wantHealthy: true},
		{name: "timeouts, output older than the grace", probe: timeout, lastOutput: 6 * time.Second, wantHealthy: false},
		{name: "timeouts, never any output", probe: timeout, wantHealthy: false},
		{name: "refused while streaming", probe: errProbe, streaming: true, wantHealthy: false},
		{name: "timeouts while streaming, grace off", probe: timeout, streaming: true, busyGrace: -1, wantHealthy: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			r := newReplica(t, "a", c, replicaOpts{})
			// Interval 2s × threshold 2 + timeout 1s: the default grace is 5s.
			h := balancer.NewHealthChecker(balancer.HealthConfig{BusyGrace: tc.busyGrace},
				newFakeProber(map[string][]error{"a": {tc.probe}}),
				func() []*balancer.Replica { return []*balancer.Replica{r} }, nil)
			if tc.lastOutput > 0 {
				l, err := r.Acquire()
				if err != nil {
					t.Fatal(err)
				}
				l.Alive()
				l.Done(nil)
				c.advance(tc.lastOutput)
			}
			for range 4 {
				if tc.streaming {
					l, err := r.Acquire()
					if err != nil {
						t.Fatal(err)
					}
					l.Alive()
					l.Done(balancer.ErrNotReplicaFault)
				}
				h.CheckOnce(context.Background())
			}
			if r.Healthy() != tc.wantHealthy {
				t.Fatalf("healthy = %v after 4 rounds, want %v", r.Healthy(), tc.wantHealthy)
			}
		})
	}
}

// TestLeaseAliveStamps: a completed request and a relayed token both count
// as output; a failed request does not.
func TestLeaseAliveStamps(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "a", c, replicaOpts{})
	if r.AliveWithin(time.Hour) {
		t.Fatal("a replica that never served is alive")
	}
	l, _ := r.Acquire()
	l.Done(errProbe)
	if r.AliveWithin(time.Hour) {
		t.Fatal("a failed request counted as output")
	}
	l, _ = r.Acquire()
	l.Done(nil)
	if !r.AliveWithin(0) {
		t.Fatal("a completed request did not count as output")
	}
	c.advance(time.Minute)
	if r.AliveWithin(time.Second) {
		t.Fatal("output a minute ago counts within a second")
	}
	l, _ = r.Acquire()
	l.Alive()
	if !r.AliveWithin(time.Second) {
		t.Fatal("a relayed token did not count as output")
	}
	l.Done(balancer.ErrNotReplicaFault)
}

// TestLeaseAliveAtSpacesTheStamps: a stream's events stamp the replica on
// its own clock, but at most once per 50 ms of the stream's (the replica
// keeps the stamp to 100 ms), so that an event needs no clock read more.
func TestLeaseAliveAtSpacesTheStamps(t *testing.T) {
	c := newFakeClock()
	r := newReplica(t, "a", c, replicaOpts{})
	l, _ := r.Acquire()
	defer l.Done(balancer.ErrNotReplicaFault)
	t0 := time.Unix(1000, 0)
	l.AliveAt(t0)
	if !r.AliveWithin(0) {
		t.Fatal("the stream's first event did not count as output")
	}
	c.advance(time.Minute)
	l.AliveAt(t0.Add(10 * time.Millisecond))
	if r.AliveWithin(time.Second) {
		t.Fatal("an event 10 ms after the last stamp stamped the replica again")
	}
	l.AliveAt(t0.Add(60 * time.Millisecond))
	if !r.AliveWithin(time.Second) {
		t.Fatal("an event 60 ms after the last stamp did not count as output")
	}
}
