package proxy

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/prometheus/client_golang/prometheus"
)

func TestShutdownLetsStreamsFinishWithinDrain(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens, up.gap = 10, 20*time.Millisecond
	tr := startRouter(t, []string{up.url})
	resp := post(t, tr.url+"/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	<-up.received
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- tr.srv.Shutdown(ctx)
	}()
	evs := sseEvents(t, resp.Body)
	if len(evs) == 0 || evs[len(evs)-1] != "[DONE]" {
		t.Fatalf("stream cut during drain: %q", evs)
	}
	for _, e := range evs {
		if strings.Contains(e, `"error"`) {
			t.Fatalf("error event during a drain that had time: %s", e)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestShutdownEndsStreamsAfterDrainDeadline(t *testing.T) {
	up := newFakeVLLM(t)
	up.tokens, up.gap = 100000, 10*time.Millisecond
	tr := startRouter(t, []string{up.url})
	resp := post(t, tr.url+"/v1/chat/completions", chatStream)
	defer resp.Body.Close()
	<-up.received
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		done <- tr.srv.Shutdown(ctx)
	}()
	evs := sseEvents(t, resp.Body)
	if len(evs) < 2 || evs[len(evs)-1] != "[DONE]" || !strings.Contains(evs[len(evs)-2], `"code":"shutting_down"`) {
		t.Fatalf("stream after the drain deadline should end with a shutting_down error and [DONE]; got last events %q", evs[max(0, len(evs)-2):])
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "upstream abort", func() bool { return up.canceled.Load() == 1 })
	if tr.srv.Active() != 0 {
		t.Fatalf("%d requests still active", tr.srv.Active())
	}
}

// A Shutdown that comes before Serve has its listener — a SIGTERM just as
// the router starts — must still end Serve: fasthttp's Shutdown closes
// only the listeners its Serve has registered, and Serve would otherwise
// accept on for good. Both orders, and the two racing.
func TestShutdownBeforeServeEndsServe(t *testing.T) {
	for _, goroutines := range []bool{false, true} {
		for i := range 20 {
			srv := newServerOnly(t, goroutines)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			start := func() { go func() { served <- srv.Serve(ln) }() }
			if i%2 == 0 {
				start() // racing the Shutdown below
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := srv.Shutdown(ctx); err != nil {
				t.Errorf("goroutines=%v try %d: Shutdown: %v", goroutines, i, err)
			}
			cancel()
			if i%2 == 1 {
				start() // after it
			}
			select {
			case err := <-served:
				if err != nil {
					t.Errorf("goroutines=%v try %d: Serve: %v", goroutines, i, err)
				}
			case <-time.After(5 * time.Second):
				ln.Close()
				<-served
				t.Fatalf("goroutines=%v try %d: Serve went on accepting after Shutdown", goroutines, i)
			}
			if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
				c.Close()
				t.Fatalf("goroutines=%v try %d: the listener still accepts after Serve returned", goroutines, i)
			}
		}
	}
}

// newServerOnly is a Server over one replica that nothing serves yet:
// the caller runs Serve and Shutdown itself.
func newServerOnly(t *testing.T, goroutines bool) *Server {
	t.Helper()
	r, err := balancer.NewReplica(balancer.ReplicaConfig{Name: "r0", URL: "http://127.0.0.1:1"}, balancer.BreakerConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: "round_robin"}, []*balancer.Replica{r})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := New(Options{Config: Config{GoroutineRequests: goroutines}, Routes: []Route{{Pool: p}}, Registerer: reg, Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}
