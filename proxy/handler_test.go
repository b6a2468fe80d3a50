package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, resp *http.Response) openAIError {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	var e openAIError
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("body is not OpenAI error JSON: %s", b)
	}
	if e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		t.Fatalf("incomplete error body: %s", b)
	}
	return e
}

func TestErrorStatusesHaveOpenAIShape(t *testing.T) {
	ok := newFakeVLLM(t)
	garbage := newFakeVLLM(t)
	garbage.garbage = true
	hang := newFakeVLLM(t)
	hang.hang = true

	okRouter := startRouter(t, []string{ok.url}, withConfig(func(c *Config) { c.MaxBodyBytes = 4096 }))
	garbageRouter := startRouter(t, []string{garbage.url})
	hangRouter := startRouter(t, []string{hang.url}, withConfig(func(c *Config) {
		c.FirstByteTimeout = 100 * time.Millisecond
		c.MaxAttempts = 1
	}))
	downRouter := startRouter(t, []string{ok.url})
	downRouter.reps[0].SetHealthy(false)

	tests := []struct {
		name      string
		router    *testRouter
		method    string
		path      string
		body      string
		status    int
		code      string
		param     string
		msgSubstr string
	}{
		{"malformed JSON", okRouter, "POST", "/v1/chat/completions", `{"model":`, 400, "invalid_request", "body", "malformed JSON"},
		{"not an object", okRouter, "POST", "/v1/chat/completions", `[1,2]`, 400, "invalid_request", "body", "object"},
		{"model wrong type", okRouter, "POST", "/v1/chat/completions", `{"model":3,"messages":[]}`, 400, "invalid_request", "model", "string"},
		{"stream wrong type", okRouter, "POST", "/v1/chat/completions", `{"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request", "stream", "boolean"},
		{"max_tokens wrong type", okRouter, "POST", "/v1/completions", `{"model":"m","prompt":"x","max_tokens":"9"}`, 400, "invalid_request", "max_tokens", "integer"},
		{"messages missing", okRouter, "POST", "/v1/chat/completions", `{"model":"m"}`, 400, "invalid_request", "messages", "required"},
		{"message role missing", okRouter, "POST", "/v1/chat/completions", `{"model":"m","messages":[{"content":"x"}]}`, 400, "invalid_request", "messages[0].role", "required"},
		{"prompt missing", okRouter, "POST", "/v1/completions", `{"model":"m"}`, 400, "invalid_request", "prompt", "required"},
		{"unknown model lists models", okRouter, "POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found", "", "m, m-alias"},
		{"unknown path", okRouter, "POST", "/v1/nothing", `{}`, 404, "not_found", "", "no route"},
		{"wrong method", okRouter, "GET", "/v1/chat/completions", ``, 405, "method_not_allowed", "", "POST"},
		{"body too large", okRouter, "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, 413, "request_too_large", "", "4096"},
		{"upstream garbage", garbageRouter, "POST", "/v1/completions", `{"model":"m","prompt":"x"}`, 502, "bad_upstream", "", "malformed JSON"},
		{"no healthy replica", downRouter, "POST", "/v1/chat/completions", chatPlain, 503, "no_healthy_replica", "", `"m"`},
		{"first byte timeout", hangRouter, "POST", "/v1/chat/completions", chatPlain, 504, "upstream_timeout", "", "in time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, tt.router.url+tt.path, strings.NewReader(tt.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tt.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, b)
			}
			e := decodeError(t, resp)
			if e.Error.Code != tt.code {
				t.Errorf("code %q, want %q", e.Error.Code, tt.code)
			}
			if tt.param != "" && (e.Error.Param == nil || *e.Error.Param != tt.param) {
				t.Errorf("param %v, want %q", e.Error.Param, tt.param)
			}
			if !strings.Contains(e.Error.Message, tt.msgSubstr) {
				t.Errorf("message %q lacks %q", e.Error.Message, tt.msgSubstr)
			}
			if tt.status == 503 && resp.Header.Get("Retry-After") == "" {
				t.Error("503 without Retry-After")
			}
		})
	}
	// The upstream sees the router's hang-up on its own goroutine.
	waitFor(t, "the hung upstream to see the router give up", func() bool { return hang.canceled.Load() == 1 })
}

// A client that sends a body over the limit is still writing it when the
// router answers 413 and closes. Closed with those bytes unread, the socket
// would send a reset, which can reach the client before it reads the
// answer and take the answer with it: it sees "connection reset by peer",
// not a 413. The router closes such a connection as nginx does (lingering
// close), so the answer arrives on either request path.
func TestOversizedBodyIsAnswered413NotReset(t *testing.T) {
	up := newFakeVLLM(t)
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 1<<20) + `"}]}`
	for _, goroutines := range []bool{false, true} {
		t.Run(fmt.Sprintf("goroutine_requests=%v", goroutines), func(t *testing.T) {
			tr := startRouter(t, []string{up.url}, withConfig(func(c *Config) {
				c.MaxBodyBytes = 4096
				c.GoroutineRequests = goroutines
			}))
			for i := 0; i < 3; i++ {
				resp := post(t, tr.url+"/v1/chat/completions", big)
				e := decodeError(t, resp)
				resp.Body.Close()
				if resp.StatusCode != 413 || e.Error.Code != "request_too_large" {
					t.Fatalf("try %d: status %d, code %q; want 413 request_too_large", i, resp.StatusCode, e.Error.Code)
				}
			}
		})
	}
}

func TestShedErrorShape(t *testing.T) {
	b := appendErrorJSON(nil, fmt.Errorf("%w: queue full", ErrShed))
	var e openAIError
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	if statusOf(ErrShed) != 429 || e.Error.Type != "rate_limit_error" || e.Error.Param != nil {
		t.Fatalf("429 shape: %s", b)
	}
	if statusOf(ErrClientGone) != 499 {
		t.Fatal("client cancel must be 499")
	}
}

func TestRetryBeforeFirstByteLandsOnAnotherReplica(t *testing.T) {
	tests := []struct {
		name  string
		first func(t *testing.T) (url string, hits func() int64)
	}{
		{"connect refused", func(t *testing.T) (string, func() int64) { return closedPort(t), func() int64 { return 1 } }},
		{"503 before streaming", func(t *testing.T) (string, func() int64) {
			f := newFakeVLLM(t)
			f.status = 503
			return f.url, f.requests.Load
		}},
		{"429 before streaming", func(t *testing.T) (string, func() int64) {
			f := newFakeVLLM(t)
			f.status = 429
			return f.url, f.requests.Load
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			badURL, badHits := tt.first(t)
			good := newFakeVLLM(t)
			tr := startRouter(t, []string{badURL, good.url}, withPolicy("round_robin"))
			resp := post(t, tr.url+"/v1/chat/completions", chatStream)
			evs := sseEvents(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || evs[len(evs)-1] != "[DONE]" {
				t.Fatalf("status %d events %q", resp.StatusCode, evs)
			}
			if got := resp.Header.Get("X-Gpurouter-Replica"); got != "r1" {
				t.Errorf("served by %q, want r1", got)
			}
			if badHits() != 1 || good.requests.Load() != 1 {
				t.Errorf("hits bad=%d good=%d, want 1 and 1", badHits(), good.requests.Load())
			}
			if tt.name == "connect refused" {
				// Nothing listens there: nothing was sent, so the next
				// replica is tried at once, and the dead one is out of
				// rotation until its health check passes.
				if len(tr.sleep()) != 0 || tr.reps[0].Healthy() {
					t.Errorf("backoff sleeps %v, refused replica healthy=%v; want no sleep, marked down", tr.sleep(), tr.reps[0].Healthy())
				}
				return
			}
			if sl := tr.sleep(); len(sl) != 1 || sl[0] <= 0 || sl[0] > 200*time.Millisecond {
				t.Errorf("backoff sleeps %v, want one jittered sleep", sl)
			}
			if !tr.reps[0].Resting(time.Now()) || tr.reps[0].BreakerState() != "closed" {
				t.Errorf("refusing replica resting=%v breaker=%s; want resting, breaker untouched", tr.reps[0].Resting(time.Now()), tr.reps[0].BreakerState())
			}
		})
	}
}

func TestBreakerOpensAndReplicaStopsReceivingTraffic(t *testing.T) {
	bad := newFakeVLLM(t)
	bad.status = 500 // not retryable: the client gets the 500, the breaker a failure
	good := newFakeVLLM(t)
	tr := startRouter(t, []string{bad.url, good.url}, withPolicy("round_robin"), withBreaker(3))
	for i := 0; i < 20; i++ {
		resp := post(t, tr.url+"/v1/chat/completions", chatPlain)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if got := bad.requests.Load(); got != 3 {
		t.Errorf("failing replica got %d requests, want 3 (breaker opens after 3 failures)", got)
	}
	if got := good.requests.Load(); got != 17 {
		t.Errorf("healthy replica got %d requests, want 17", got)
	}
	if st := tr.reps[0].BreakerState(); st != "open" {
		t.Errorf("breaker %s, want open", st)
	}
}

func TestRouterEndpoints(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouter(t, []string{up.url})
	get := func(path string) (int, string) {
		resp, err := http.Get(tr.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, _ := get("/health"); st != 200 {
		t.Errorf("/health %d", st)
	}
	if st, body := get("/v1/models"); st != 200 || !strings.Contains(body, `"id":"m"`) || !strings.Contains(body, `"id":"m-alias"`) {
		t.Errorf("/v1/models %d %s", st, body)
	}
	if up.requests.Load() != 0 {
		t.Error("/v1/models reached a replica")
	}
	if st, _ := get("/ready"); st != 200 {
		t.Errorf("/ready %d with a healthy replica", st)
	}
	tr.reps[0].SetHealthy(false)
	if st, body := get("/ready"); st != 503 || !strings.Contains(body, `"m"`) {
		t.Errorf("/ready %d %s with no healthy replica", st, body)
	}
	tr.reps[0].SetHealthy(true)
	resp := post(t, tr.url+"/v1/chat/completions", chatPlain)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	waitFor(t, "finish", func() bool { return tr.srv.Active() == 0 })
	st, body := get("/metrics")
	for _, name := range []string{"gpurouter_requests_total", "gpurouter_e2e_request_latency_seconds_bucket", "gpurouter_replica_in_flight_requests", "gpurouter_upstream_connect_seconds", "gpurouter_request_queue_time_seconds"} {
		if st != 200 || !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if st, body := get("/debug/pools"); st != 200 || !strings.Contains(body, `"policy":"round_robin"`) {
		t.Errorf("/debug/pools %d %s", st, body)
	}
}

func TestHeadersAndRequestID(t *testing.T) {
	up := newFakeVLLM(t)
	tr := startRouter(t, []string{up.url})
	t.Run("kept", func(t *testing.T) {
		resp := post(t, tr.url+"/v1/chat/completions", chatPlain, "X-Request-Id", "abc-123", "Connection", "keep-alive, X-Secret-Hop", "X-Secret-Hop", "1", "Authorization", "Bearer k", "Keep-Alive", "timeout=5")
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		h := <-up.headers
		if h.Get("X-Request-Id") != "abc-123" || resp.Header.Get("X-Request-Id") != "abc-123" {
			t.Errorf("request id upstream %q, client %q", h.Get("X-Request-Id"), resp.Header.Get("X-Request-Id"))
		}
		if h.Get("Authorization") != "Bearer k" {
			t.Error("Authorization not forwarded")
		}
		for _, hop := range []string{"X-Secret-Hop", "Keep-Alive", "Accept-Encoding"} {
			if h.Get(hop) != "" {
				t.Errorf("hop-by-hop header %s forwarded: %q", hop, h.Get(hop))
			}
		}
		if resp.Header.Get("X-Gpurouter-Replica") != "r0" {
			t.Errorf("replica header %q", resp.Header.Get("X-Gpurouter-Replica"))
		}
	})
	t.Run("generated", func(t *testing.T) {
		resp := post(t, tr.url+"/v1/chat/completions", chatPlain)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		h := <-up.headers
		if id := h.Get("X-Request-Id"); id == "" || id != resp.Header.Get("X-Request-Id") {
			t.Errorf("generated id upstream %q, client %q", id, resp.Header.Get("X-Request-Id"))
		}
	})
}

func TestPathPrefixRoutesWithoutModel(t *testing.T) {
	up := newFakeVLLM(t)
	other := newFakeVLLM(t)
	tr := startRouter(t, []string{other.url})
	_ = tr
	pr := startRouter(t, []string{up.url}, func(_ *Config, pc *balancer.PoolConfig, _ *balancer.BreakerConfig) {
		pc.PathPrefix = "/v1/chat/tinyllama"
	})
	resp := post(t, pr.url+"/v1/chat/tinyllama", `{"messages":[{"role":"user","content":"hi"}]}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || up.requests.Load() != 1 {
		t.Fatalf("status %d, upstream hits %d", resp.StatusCode, up.requests.Load())
	}
	r := <-up.received
	if r.URL.Path != "/v1/chat/completions" {
		t.Errorf("upstream path %q", r.URL.Path)
	}
}

// A reload updates a pool's replicas in place before it publishes the
// route table with their upstream connections (SetPools). A request
// that picks a replica in between must not use a missing upstream: it goes
// to a replica the router can reach, and the new one takes traffic once
// its table is published.
func TestReplicaAddedBeforeRoutesPublished(t *testing.T) {
	old, added := newFakeVLLM(t), newFakeVLLM(t)
	tr := startRouter(t, []string{old.url}, withPolicy("round_robin"))
	r1, err := balancer.NewReplica(balancer.ReplicaConfig{Name: "r1", URL: added.url}, balancer.BreakerConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr.pool.SetReplicas([]*balancer.Replica{tr.reps[0], r1})
	served := func() map[string]int {
		m := map[string]int{}
		for range 6 {
			resp := post(t, tr.url+"/v1/chat/completions", chatPlain)
			io.Copy(io.Discard, resp.Body) //nolint:errcheck
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			m[resp.Header.Get("X-Gpurouter-Replica")]++
		}
		return m
	}
	if got := served(); got["r0"] != 6 {
		t.Fatalf("before the routes are published: served by %v, want r0 only", got)
	}
	if n := r1.InFlight(); n != 0 {
		t.Fatalf("r1 holds %d leases after being skipped", n)
	}
	if err := tr.srv.SetRoutes([]Route{{Pool: tr.pool}}); err != nil {
		t.Fatal(err)
	}
	if got := served(); got["r0"] != 3 || got["r1"] != 3 {
		t.Fatalf("after: served by %v, want 3 and 3", got)
	}
}
