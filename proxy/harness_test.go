package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// testRouter is a Server on a loopback port over the given upstreams.
type testRouter struct {
	url  string
	srv  *Server
	pool *balancer.Pool
	reps []*balancer.Replica
	reg  *prometheus.Registry

	mu     sync.Mutex      // the router's retry pauses run on its goroutines (a request loop's too)
	sleeps []time.Duration // each retry pause asked for (Options.Sleep), not slept
}

// sleep is the retry pauses the router asked for so far.
func (tr *testRouter) sleep() []time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.sleeps)
}

type routerOpt func(*Config, *balancer.PoolConfig, *balancer.BreakerConfig)

func withPolicy(p string) routerOpt {
	return func(_ *Config, pc *balancer.PoolConfig, _ *balancer.BreakerConfig) { pc.Policy = p }
}

func withConfig(f func(*Config)) routerOpt {
	return func(c *Config, _ *balancer.PoolConfig, _ *balancer.BreakerConfig) { f(c) }
}

func withBreaker(n int) routerOpt {
	return func(_ *Config, _ *balancer.PoolConfig, bc *balancer.BreakerConfig) {
		bc.ConsecutiveFailures = n
		bc.OpenTimeout = time.Hour
	}
}

func startRouter(t testing.TB, urls []string, opts ...routerOpt) *testRouter {
	t.Helper()
	return startRouterWith(t, urls, nil, opts...)
}

// startRouterWith is startRouter with a last say on the Server's Options
// (keys, logger); edit may be nil.
func startRouterWith(t testing.TB, urls []string, edit func(*Options), opts ...routerOpt) *testRouter {
	t.Helper()
	cfg := Config{DisconnectCheck: 20 * time.Millisecond, GoroutineRequests: testGoroutineRequests(t)}
	pc := balancer.PoolConfig{Model: "m", Aliases: []string{"m-alias"}, Policy: "round_robin"}
	bc := balancer.BreakerConfig{}
	for _, o := range opts {
		o(&cfg, &pc, &bc)
	}
	tr := &testRouter{reg: prometheus.NewRegistry()}
	for i, u := range urls {
		r, err := balancer.NewReplica(balancer.ReplicaConfig{Name: "r" + string(rune('0'+i)), URL: u}, bc, nil)
		if err != nil {
			t.Fatal(err)
		}
		tr.reps = append(tr.reps, r)
	}
	p, err := balancer.NewPool(pc, tr.reps)
	if err != nil {
		t.Fatal(err)
	}
	tr.pool = p
	o := Options{
		Config: cfg, Routes: []Route{{Pool: p}}, Registerer: tr.reg, Gatherer: tr.reg,
		Sleep: func(d time.Duration) { tr.mu.Lock(); tr.sleeps = append(tr.sleeps, d); tr.mu.Unlock() },
	}
	if edit != nil {
		edit(&o)
	}
	srv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	tr.srv = srv
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr.url = "http://" + ln.Addr().String()
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }() //nolint:errcheck
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx) //nolint:errcheck
		<-done
		// Every connection to a replica is counted against its cap from
		// its dial to its close, whichever path holds it (conncap.go):
		// once the router has stopped and the pools' idle ones are
		// closed, none is left counted.
		for _, u := range srv.routes.Load().upstreams {
			if hc, ok := u.client.(*fasthttp.HostClient); ok {
				hc.CloseIdleConnections()
			}
			u.idle.mu.Lock()
			idle := u.idle.conns
			u.idle.conns = nil
			u.idle.mu.Unlock()
			for _, ic := range idle {
				u.idle.closeAll([]net.Conn{ic.c})
			}
			deadline := time.Now().Add(5 * time.Second)
			for u.cap.open() != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := u.cap.open(); n != 0 {
				t.Errorf("replica %s: %d connections still counted against its cap after shutdown", u.replica.Name(), n)
			}
		}
	})
	return tr
}

// testGoroutineRequests is whether test routers serve whole requests on
// fasthttp's goroutines instead of the request loops (the default, where
// Linux has them): GPUROUTER_TEST_GOROUTINE_REQUESTS=1 runs the whole
// suite so, as TestGoroutineRequestsKeepTheRequestPathsBehaviours runs
// the real-engine behaviours so always.
func testGoroutineRequests(t testing.TB) bool {
	switch v := os.Getenv("GPUROUTER_TEST_GOROUTINE_REQUESTS"); v {
	case "", "0":
		return false
	case "1":
		return true
	default:
		t.Fatalf("GPUROUTER_TEST_GOROUTINE_REQUESTS=%q: want 0 or 1", v)
		return false
	}
}

// post sends a JSON body and returns the response (caller closes it).
func post(t *testing.T, url, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sseEvents reads every data: payload of a stream.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, p)
		}
	}
	return out
}

// waitFor polls cond (bounded: 5 s) — for effects that happen on another
// goroutine after the response, like the finish of a stream.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitWithin(t, 5*time.Second, what, cond)
}

// waitWithin is waitFor with its own bound, for a wait that does a lot of
// work under the race detector on a loaded box.
func waitWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

const chatStream = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
const chatPlain = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
