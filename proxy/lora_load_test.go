package proxy

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/bench/sim"
)

// loadSims runs n simulated replicas of model "m" with LoRA enabled
// (max_loras 2), the runtime LoRA API on or off, the given faults, and
// mods served from the start.
func loadSims(t *testing.T, n int, runtime bool, faults sim.Faults, mods ...sim.LoRAModule) *sim.Fleet {
	t.Helper()
	p, err := sim.Builtin("qwen2.5-7b")
	if err != nil {
		t.Fatal(err)
	}
	p.Engine.EnableLoRA, p.Engine.MaxLoRAs = true, 2
	return runSims(t, sim.FleetConfig{Replicas: n, Profiles: []sim.Profile{p}, ServedModelNames: []string{"m"}, Seed: 7,
		LoRAModules: mods, AllowRuntimeLoRAUpdating: runtime, Faults: faults})
}

// withLoadOnDemand makes the pool load sql-lora on demand, from a path.
func withLoadOnDemand(policy string, edit func(*balancer.LoRAConfig)) routerOpt {
	return func(_ *Config, pc *balancer.PoolConfig, _ *balancer.BreakerConfig) {
		pc.Policy = policy
		pc.LoRA = balancer.LoRAConfig{Adapters: []string{"sql-lora"}, LoadOnDemand: true,
			Paths: map[string]string{"sql-lora": "/adapters/sql"}, LoadBackoff: time.Minute}
		if edit != nil {
			edit(&pc.LoRA)
		}
	}
}

// loads is the router's count of loads of result for model m.
func loads(tr *testRouter, result string) int {
	return int(testutil.ToFloat64(tr.srv.m.loraLoads.WithLabelValues("m", result)))
}

// holding lists the sim replicas serving adapter.
func holding(f *sim.Fleet, adapter string) []int {
	var out []int
	for i, r := range f.Replicas() {
		for _, a := range r.Adapters() {
			if a == adapter {
				out = append(out, i)
			}
		}
	}
	return out
}

// chatAdapter sends one chat request for sql-lora (streamed or not) and
// returns the answer's status, body (a stream's events joined) and
// Retry-After.
func chatAdapter(t *testing.T, url string, stream bool) (int, string, string) {
	t.Helper()
	body := `{"model":"sql-lora","messages":[{"role":"user","content":"SELECT 1"}],"max_tokens":4`
	if stream {
		body += `,"stream":true`
	}
	resp := post(t, url+"/v1/chat/completions", body+"}")
	defer resp.Body.Close()
	if stream && resp.StatusCode == http.StatusOK {
		return resp.StatusCode, strings.Join(sseEvents(t, resp.Body), "\n"), ""
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Retry-After")
}

// An adapter no replica has is loaded on the one its request is placed
// on, then served there, streamed and not; later requests find it there
// and load nothing.
func TestLoRALoadOnDemandServes(t *testing.T) {
	for _, policy := range []string{"predictive", "least_loaded"} {
		t.Run(policy, func(t *testing.T) {
			f := loadSims(t, 2, true, sim.Faults{})
			tr := startRouter(t, f.URLs(), withLoadOnDemand(policy, nil))
			for i, r := range tr.reps {
				r.SetAdapters(f.Replicas()[i].Adapters()) // as the /v1/models watch does: none
			}
			st, body, _ := chatAdapter(t, tr.url, false)
			if st != http.StatusOK || !strings.Contains(body, `"model":"sql-lora"`) {
				t.Fatalf("%d %s", st, body)
			}
			if h := holding(f, "sql-lora"); len(h) != 1 || loads(tr, "loaded") != 1 {
				t.Fatalf("loaded on %v, %d loads", h, loads(tr, "loaded"))
			}
			st, body, _ = chatAdapter(t, tr.url, true)
			if st != http.StatusOK || !strings.HasSuffix(body, "[DONE]") || !strings.Contains(body, `"model":"sql-lora"`) {
				t.Fatalf("stream: %d %s", st, body)
			}
			for range 5 {
				if st, body, _ := chatAdapter(t, tr.url, false); st != http.StatusOK {
					t.Fatalf("%d %s", st, body)
				}
			}
			if n := loads(tr, "loaded") + loads(tr, "already_loaded") + loads(tr, "failed"); n != 1 {
				t.Fatalf("%d load calls for requests one at a time, want 1", n)
			}
		})
	}
}

// Twenty requests at once for an adapter no replica has, the loads slow
// (the sim's lora_load_delay fault): each replica chosen is asked to load
// it once — the requests placed there share the load in flight — and
// every request is served.
func TestLoRALoadOnDemandConcurrent(t *testing.T) {
	f := loadSims(t, 2, true, sim.Faults{LoRALoadDelaySeconds: 0.2})
	tr := startRouter(t, f.URLs(), withLoadOnDemand("predictive", nil))
	for i, r := range tr.reps {
		r.SetAdapters(f.Replicas()[i].Adapters())
	}
	const n = 20
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if st, _, _ := chatAdapter(t, tr.url, false); st != http.StatusOK {
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d of %d requests failed", bad.Load(), n)
	}
	h := holding(f, "sql-lora")
	if len(h) == 0 || loads(tr, "loaded") != len(h) || loads(tr, "already_loaded") != 0 || loads(tr, "failed") != 0 {
		t.Fatalf("adapter on replicas %v after %d loads, %d already loaded, %d failed",
			h, loads(tr, "loaded"), loads(tr, "already_loaded"), loads(tr, "failed"))
	}
}

// A replica whose /v1/models lists the adapter is not asked to load it;
// one the router knows nothing of is, and the engine's "already loaded"
// counts as loaded.
func TestLoRALoadOnDemandAlreadyThere(t *testing.T) {
	mod := sim.LoRAModule{Name: "sql-lora", Path: "/adapters/sql"}
	t.Run("listed", func(t *testing.T) {
		f := loadSims(t, 2, true, sim.Faults{}, mod)
		tr := startRouter(t, f.URLs(), withLoadOnDemand("predictive", nil))
		for i, r := range tr.reps {
			r.SetAdapters(f.Replicas()[i].Adapters())
		}
		for range 6 {
			if st, body, _ := chatAdapter(t, tr.url, false); st != http.StatusOK {
				t.Fatalf("%d %s", st, body)
			}
		}
		for _, res := range []string{"loaded", "already_loaded", "failed", "backoff"} {
			if n := loads(tr, res); n != 0 {
				t.Fatalf("%d loads %s for an adapter every replica lists", n, res)
			}
		}
	})
	t.Run("not known", func(t *testing.T) {
		f := loadSims(t, 1, true, sim.Faults{}, mod)
		tr := startRouter(t, f.URLs(), withLoadOnDemand("predictive", nil)) // no /v1/models read
		for range 3 {
			if st, body, _ := chatAdapter(t, tr.url, false); st != http.StatusOK {
				t.Fatalf("%d %s", st, body)
			}
		}
		if loads(tr, "already_loaded") != 1 || loads(tr, "loaded")+loads(tr, "failed") != 0 {
			t.Fatalf("loads: %d already, %d loaded, %d failed", loads(tr, "already_loaded"), loads(tr, "loaded"), loads(tr, "failed"))
		}
	})
}

// loadAPI is a fake engine's runtime LoRA API that fails: every POST
// /v1/load_lora_adapter answered status (0: never, until the caller goes
// away) and counted.
type loadAPI struct {
	url    string
	status int
	body   string
	calls  atomic.Int64
}

func startLoadAPI(t *testing.T, status int, body string) *loadAPI {
	t.Helper()
	a := &loadAPI{status: status, body: body}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.url = "http://" + ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/load_lora_adapter" {
			http.Error(w, "the router sent a request for an adapter it could not load", http.StatusTeapot)
			return
		}
		a.calls.Add(1)
		if a.status == 0 {
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		io.WriteString(w, a.body) //nolint:errcheck
	})}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
	return a
}

// Every way a load fails — the engine refuses (400), its runtime API is
// off (404), it errs (500), nothing listens, it does not answer in time —
// gives each request one clear 503 (lora_adapter_unavailable, Retry-After
// the backoff's end) and costs at most one load call per replica for the
// backoff, however many requests come, one at a time or at once.
func TestLoRALoadOnDemandFailures(t *testing.T) {
	const replicas = 2
	tests := []struct {
		name  string
		urls  func(t *testing.T) ([]string, func() int) // the replicas, and the load calls they saw (nil: the router's count)
		want  string                                    // in the error's message
		short bool                                      // a short load timeout
	}{
		{name: "refused by the engine (sim fault, 400)", want: "answered 400", urls: func(t *testing.T) ([]string, func() int) {
			return loadSims(t, replicas, true, sim.Faults{LoRALoadRefuse: true}).URLs(), nil
		}},
		{name: "runtime API off (sim, 404)", want: "runtime LoRA API is off", urls: func(t *testing.T) ([]string, func() int) {
			return loadSims(t, replicas, false, sim.Faults{}).URLs(), nil
		}},
		{name: "engine error (500)", want: "answered 500: boom", urls: func(t *testing.T) ([]string, func() int) {
			return fakeLoadAPIs(t, replicas, http.StatusInternalServerError, `{"error":{"message":"boom"}}`)
		}},
		{name: "nothing listens", want: "load call failed", urls: func(t *testing.T) ([]string, func() int) {
			return []string{closedPort(t), closedPort(t)}, nil
		}},
		{name: "no answer in time", want: "did not answer within", short: true, urls: func(t *testing.T) ([]string, func() int) {
			return fakeLoadAPIs(t, replicas, 0, "")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			urls, calls := tt.urls(t)
			tr := startRouter(t, urls, withLoadOnDemand("least_loaded", func(c *balancer.LoRAConfig) {
				if tt.short {
					c.LoadTimeout = 150 * time.Millisecond
				}
			}))
			if calls == nil {
				calls = func() int { return loads(tr, "failed") + loads(tr, "loaded") + loads(tr, "already_loaded") }
			}
			check := func(st int, body, retryAfter string) {
				t.Helper()
				var doc struct {
					Error struct{ Message, Code string }
				}
				json.Unmarshal([]byte(body), &doc) //nolint:errcheck
				if st != http.StatusServiceUnavailable || doc.Error.Code != "lora_adapter_unavailable" ||
					!strings.Contains(doc.Error.Message, tt.want) || !strings.Contains(doc.Error.Message, "sql-lora") || retryAfter == "" {
					t.Fatalf("%d %q (Retry-After %q), want 503 lora_adapter_unavailable saying %q", st, body, retryAfter, tt.want)
				}
			}
			for range 5 {
				check(chatAdapter(t, tr.url, false))
			}
			var wg sync.WaitGroup
			for range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st, body, ra := chatAdapter(t, tr.url, true)
					if st != http.StatusServiceUnavailable || !strings.Contains(body, "lora_adapter_unavailable") || ra == "" {
						t.Errorf("stream: %d %q", st, body)
					}
				}()
			}
			wg.Wait()
			if n := calls(); n < 1 || n > replicas {
				t.Fatalf("%d load calls for 15 requests to %d replicas, want 1 to %d", n, replicas, replicas)
			}
			if loads(tr, "backoff") == 0 {
				t.Fatal("no request was answered from a failed load's backoff")
			}
		})
	}
}

// fakeLoadAPIs starts n loadAPIs answering status and body: their URLs,
// and their load calls summed.
func fakeLoadAPIs(t *testing.T, n, status int, body string) ([]string, func() int) {
	var urls []string
	var apis []*loadAPI
	for range n {
		a := startLoadAPI(t, status, body)
		urls, apis = append(urls, a.url), append(apis, a)
	}
	return urls, func() int {
		s := 0
		for _, a := range apis {
			s += int(a.calls.Load())
		}
		return s
	}
}

// A replica whose load fails is passed over for one that loads the
// adapter: every request is served, and the failing one is asked once.
func TestLoRALoadOnDemandFailsOver(t *testing.T) {
	f := loadSims(t, 2, true, sim.Faults{})
	if err := f.Replicas()[0].SetFaults(sim.Faults{LoRALoadRefuse: true}); err != nil {
		t.Fatal(err)
	}
	tr := startRouter(t, f.URLs(), withLoadOnDemand("least_loaded", nil))
	for i, r := range tr.reps {
		r.SetAdapters(f.Replicas()[i].Adapters())
	}
	for range 8 {
		if st, body, _ := chatAdapter(t, tr.url, false); st != http.StatusOK {
			t.Fatalf("%d %s", st, body)
		}
	}
	if h := holding(f, "sql-lora"); len(h) != 1 || h[0] != 1 {
		t.Fatalf("adapter on %v, want on replica 1 only", h)
	}
	if loads(tr, "failed") > 1 || loads(tr, "loaded") != 1 {
		t.Fatalf("%d failed loads, %d loaded", loads(tr, "failed"), loads(tr, "loaded"))
	}
}

// A load that outlasts a request's total deadline ends the request at its
// deadline (504, the router's timeout), not at the load's own timeout;
// the load goes on for the requests that share it. And a client that
// leaves while its adapter loads stops waiting: the router holds nothing
// of it once the load times out.
func TestLoRALoadOnDemandWithinTheDeadline(t *testing.T) {
	urls, calls := fakeLoadAPIs(t, 1, 0, "") // never answers
	tr := startRouter(t, urls, withLoadOnDemand("least_loaded", func(c *balancer.LoRAConfig) {
		c.LoadTimeout = 5 * time.Second
	}), withConfig(func(c *Config) { c.TotalTimeout = 300 * time.Millisecond }))
	start := time.Now()
	st, body, _ := chatAdapter(t, tr.url, false)
	took := time.Since(start)
	if st != http.StatusGatewayTimeout {
		t.Fatalf("%d %q after %v, want 504 at the request's deadline", st, body, took)
	}
	if took > 3*time.Second {
		t.Fatalf("answered after %v: the wait outlasted the 300ms deadline", took)
	}
	// A second request shares the load in flight: no second call.
	if st, body, _ := chatAdapter(t, tr.url, true); st != http.StatusGatewayTimeout {
		t.Fatalf("stream: %d %q, want 504", st, body)
	}
	if n := calls(); n != 1 {
		t.Fatalf("%d load calls, want the one both requests shared", n)
	}
	// The load still ends within its own timeout, as a failure the
	// next request reads at once.
	deadline := time.Now().Add(10 * time.Second)
	for loads(tr, "failed") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the load never ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
