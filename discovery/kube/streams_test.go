package kube_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
	"github.com/gpurouter/gpurouter/discovery/kube"
	"github.com/gpurouter/gpurouter/discovery/kubetest"
	"github.com/gpurouter/gpurouter/fleet"
	"github.com/gpurouter/gpurouter/proxy"
	"k8s.io/client-go/kubernetes"
)

// simOn runs one simulated vLLM replica serving model "m" on host:port
// until the test ends.
func simOn(t *testing.T, host string, port int) error {
	t.Helper()
	p, err := sim.Builtin("qwen2.5-7b")
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.NewFleet(sim.FleetConfig{Replicas: 1, Host: host, BasePort: port, Profiles: []sim.Profile{p}, ServedModelNames: []string{"m"}, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Listen(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return nil
}

// simPods runs two replicas on one port of two loopback addresses, as two
// pods' IPs serving the same container port: 127.0.0.2 and 127.0.0.3
// (Linux routes all of 127/8 to lo).
func simPods(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Skipf("no 127.0.0.2 on this host: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if simOn(t, "127.0.0.2", port) == nil && simOn(t, "127.0.0.3", port) == nil {
			return port
		}
	}
	t.Fatal("no port free on both 127.0.0.2 and 127.0.0.3 in 20 tries")
	return 0
}

// streamed is what one streaming client saw.
type streamed struct {
	replica string
	done    bool // data: [DONE] arrived
	errMsg  string
	chunks  int
}

// stream sends a streaming chat request and reads it to the end; started
// is signalled at the first content chunk.
func stream(url string, maxTokens int, started func()) streamed {
	var s streamed
	body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"Tell me a long story."}]}`, maxTokens)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		s.errMsg = err.Error()
		started()
		return s
	}
	defer resp.Body.Close()
	s.replica = resp.Header.Get("X-Gpurouter-Replica")
	sc := bufio.NewScanner(resp.Body)
	first := true
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			s.done = true
			continue
		}
		if strings.Contains(data, `"error"`) {
			s.errMsg = data
		}
		s.chunks++
		if first {
			first = false
			started()
		}
	}
	if first {
		started()
	}
	return s
}

// oneShot sends a short non-streaming request and returns the replica that
// served it.
func oneShot(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var v struct{ Choices []json.RawMessage }
	if err := json.Unmarshal(b, &v); err != nil || len(v.Choices) == 0 {
		t.Fatalf("bad body %s: %v", b, err)
	}
	return resp.Header.Get("X-Gpurouter-Replica")
}

// waitFleet waits until cond holds of the fleet, failing after follow.
func waitFleet(t *testing.T, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > follow {
			t.Fatalf("%s: not within %v", what, follow)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%s: followed in %v", what, time.Since(start).Round(time.Millisecond))
}

// Acceptance 1 (the streams), through the router's own path: pods on
// loopback addresses, found by a kube source whose sink is the fleet
// (fleet.SetEndpoints, as serve wires it), served by the proxy. While
// streams run on a pod that turns terminating, every stream ends with
// [DONE], no new request goes there, and the deleted pod leaves the pool.
func testStreams(t *testing.T, c *kubetest.Cluster, cs kubernetes.Interface) {
	port := simPods(t)
	namespace(t, cs, "streams")
	p := pods{t, cs, "streams"}
	vllm := map[string]string{"app": "vllm"}
	p.create("a", vllm)
	p.create("b", vllm)
	p.status("a", "127.0.0.2", true)
	p.status("b", "127.0.0.3", true)

	// Migration off: streams on the draining replica finish where they
	// are, which is what this test is about.
	f, err := fleet.New(fleet.Spec{Pools: []fleet.Pool{{Model: "m", Policy: "round_robin", Discovered: true}}}, fleet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(proxy.Options{Routes: f.Routes()})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Attach(srv); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	})
	run(t, f)
	src, err := kube.New(kube.Config{Model: "m", Namespace: "streams", Selector: "app=vllm", Port: port}, clients(t, c, kubetest.AdminUser), f, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, src)
	waitFleet(t, "both pods in the pool", func() bool { return f.Replica("m", "a") != nil && f.Replica("m", "b") != nil })

	const streams = 8
	var wg sync.WaitGroup
	var startWG sync.WaitGroup
	results := make([]streamed, streams)
	startWG.Add(streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = stream(url, 400, startWG.Done)
		}()
	}
	startWG.Wait()
	ra := f.Replica("m", "a")
	if ra.InFlight() == 0 {
		t.Fatalf("no stream on a (round robin over %d streams)", streams)
	}
	p.terminate("a")
	waitFleet(t, "a draining", ra.Draining)
	inFlight := ra.InFlight()
	for range 10 {
		if got := oneShot(t, url); got != "b" {
			t.Fatalf("a new request went to %q while a terminates", got)
		}
	}
	wg.Wait()
	onA := 0
	for i, r := range results {
		if !r.done || r.errMsg != "" {
			t.Errorf("stream %d on %s: done %v, error %q, %d chunks", i, r.replica, r.done, r.errMsg, r.chunks)
		}
		if r.replica == "a" {
			onA++
		}
	}
	t.Logf("%d streams on a while it terminated (%d still running when it drained), %d on b; all ended with [DONE]", onA, inFlight, streams-onA)
	if inFlight == 0 {
		t.Error("every stream on a had ended before it drained: the test proved nothing")
	}
	p.remove("a")
	waitFleet(t, "a removed", func() bool { return f.Replica("m", "a") == nil })
}
