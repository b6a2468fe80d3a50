package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
)

// runRouter starts r on a loopback port until the test ends.
func runRouter(t *testing.T, r *router) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.run(ctx, ln, 5*time.Second); close(done) }() //nolint:errcheck
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String()
}

// runAdmin serves r's admin API on a loopback port until the test ends.
func runAdmin(t *testing.T, r *router, token string, reload func() error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.admin(ln, token, reload).Run(ctx); close(done) }() //nolint:errcheck
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String()
}

func simPoolConfig(urls []string, names ...int) poolConfig {
	pc := poolConfig{Model: "m", Policy: "round_robin"}
	for _, i := range names {
		pc.Replicas = append(pc.Replicas, replicaConfig{URL: urls[i], Name: fmt.Sprintf("r%d", i)})
	}
	return pc
}

// Reload under load: 500 streams in flight while the pool's policy
// changes, a replica is added and one that is serving streams is removed;
// every stream must end with [DONE] and no error event.
func TestReloadUnderLoadBreaksNoStream(t *testing.T) {
	fleet := startSimFleet(t, 3, nil)
	urls := fleet.URLs()
	cfg := fileConfig{Log: logConfig{Level: "error"}, Pools: []poolConfig{simPoolConfig(urls, 0, 1)}}
	applyDefaults(&cfg)
	if err := validate(cfg); err != nil {
		t.Fatal(err)
	}
	r, err := newRouter(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	base := runRouter(t, r)

	const streams = 500
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams, MaxConnsPerHost: streams}}
	var started, clean atomic.Int64
	var wg sync.WaitGroup
	failures := make(chan string, streams)
	for i := 0; i < streams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"model":"m","stream":true,"max_tokens":120,"ignore_eos":true,"messages":[{"role":"user","content":"reload"}]}`
			resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				failures <- err.Error()
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			first, done := true, false
			for sc.Scan() {
				line := sc.Text()
				if first && strings.HasPrefix(line, "data: ") {
					started.Add(1)
					first = false
				}
				if strings.Contains(line, `"error"`) {
					failures <- line
					return
				}
				done = done || line == "data: [DONE]"
			}
			if !done {
				failures <- fmt.Sprintf("status %d: stream ended without [DONE]", resp.StatusCode)
				return
			}
			clean.Add(1)
		}()
	}
	deadline := time.Now().Add(60 * time.Second)
	for started.Load() < streams/2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}

	next := cfg
	next.Pools = []poolConfig{simPoolConfig(urls, 1, 2)}
	next.Pools[0].Policy = "least_loaded"
	if err := r.reload(next); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Errorf("broken stream: %s", f)
	}
	if clean.Load() != streams {
		t.Fatalf("%d of %d streams ended cleanly", clean.Load(), streams)
	}
	// After the reload r0 takes nothing and the new policy decides.
	p := r.srv.Pools()[0]
	if p.Policy() != "least_loaded" || len(p.Replicas()) != 2 || p.Replicas()[0].Name() != "r1" {
		t.Fatalf("after reload: policy %s, replicas %d", p.Policy(), len(p.Replicas()))
	}
	for i := 0; i < 6; i++ {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := resp.Header.Get("X-Gpurouter-Replica"); got == "r0" {
			t.Fatal("removed replica still receives requests")
		}
	}
}

const chatBody = `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`

func TestAdminAPI(t *testing.T) {
	fleet := startSimFleet(t, 3, nil)
	urls := fleet.URLs()
	cfg := fileConfig{Log: logConfig{Level: "error"}, Pools: []poolConfig{simPoolConfig(urls, 0, 1)}}
	applyDefaults(&cfg)
	r, err := newRouter(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	base := runRouter(t, r)
	const token = "admin-token-0123456789"
	adminURL := runAdmin(t, r, token, func() error { return fmt.Errorf("reload: no file in this test") })

	call := func(method, path, tok, body string) (int, string) {
		req, _ := http.NewRequest(method, adminURL+path, strings.NewReader(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	servedBy := func() string {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Header.Get("X-Gpurouter-Replica")
	}

	tests := []struct {
		name, method, path, token, body string
		status                          int
		check                           func(t *testing.T)
	}{
		{"no token", "GET", "/admin/state", "", "", 401, nil},
		{"wrong token", "GET", "/admin/state", "nope-nope-nope-nope", "", 401, nil},
		{"state", "GET", "/admin/state", token, "", 200, nil},
		{"drain r0", "POST", "/admin/pools/m/replicas/r0/drain", token, "", 200, func(t *testing.T) {
			for i := 0; i < 4; i++ {
				if got := servedBy(); got != "r1" {
					t.Fatalf("drained r0 still served (got %s)", got)
				}
			}
		}},
		{"undrain r0", "POST", "/admin/pools/m/replicas/r0/undrain", token, "", 200, nil},
		{"add r2", "POST", "/admin/pools/m/replicas", token, `{"url":"` + urls[2] + `","name":"r2"}`, 200, func(t *testing.T) {
			if n := len(r.srv.Pools()[0].Replicas()); n != 3 {
				t.Fatalf("%d replicas after add", n)
			}
		}},
		{"remove r0", "DELETE", "/admin/pools/m/replicas/r0", token, "", 200, func(t *testing.T) {
			for i := 0; i < 4; i++ {
				if got := servedBy(); got == "r0" {
					t.Fatal("removed r0 still served")
				}
			}
		}},
		{"switch policy", "PUT", "/admin/pools/m/policy", token, `{"policy":"p2c"}`, 200, func(t *testing.T) {
			if p := r.srv.Pools()[0].Policy(); p != "p2c" {
				t.Fatalf("policy %s", p)
			}
		}},
		{"bad policy rejected, old kept", "PUT", "/admin/pools/m/policy", token, `{"policy":"fastest"}`, 400, func(t *testing.T) {
			if p := r.srv.Pools()[0].Policy(); p != "p2c" {
				t.Fatalf("policy %s after a rejected change", p)
			}
		}},
		{"arms", "PUT", "/admin/pools/m/policy", token, `{"arms":[{"name":"a","policy":"round_robin"},{"name":"b","policy":"least_tokens"}]}`, 200, nil},
		{"unknown pool", "POST", "/admin/pools/zz/replicas/r0/drain", token, "", 404, nil},
		{"reload error is reported", "POST", "/admin/reload", token, "", 400, nil},
		{"pprof", "GET", "/debug/pprof/cmdline", token, "", 200, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, body := call(tt.method, tt.path, tt.token, tt.body)
			if st != tt.status {
				t.Fatalf("status %d, want %d: %s", st, tt.status, body)
			}
			if tt.check != nil {
				tt.check(t)
			}
		})
	}
	if _, body := call("GET", "/admin/state", token, ""); strings.Contains(body, token) {
		t.Fatal("admin state leaks the admin token")
	}
}
