package main

// Helpers shared by the fault matrix (faults_test.go), the limits tests
// (limits_test.go) and the soak (soak_test.go): a router under test and
// the views of it the tests assert on — what a client saw, and what the
// router recorded in /metrics, /debug/pools and its admission queues.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// testRouter is a router started the way serve starts it, on loopback.
type testRouter struct {
	t    *testing.T
	r    *router
	base string
}

// startTestRouter fills cfg's defaults, validates it, and serves it until
// the test ends. log may be nil.
func startTestRouter(t *testing.T, cfg fileConfig, log *zap.Logger) *testRouter {
	t.Helper()
	applyDefaults(&cfg)
	if err := validate(cfg); err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	r, err := newRouter(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	return &testRouter{t: t, r: r, base: runRouter(t, r)}
}

// chatRequest is a chat completion body; maxTokens < 0 leaves max_tokens out.
func chatRequest(stream bool, maxTokens int) string {
	mt := ""
	if maxTokens >= 0 {
		mt = fmt.Sprintf(`"max_tokens":%d,`, maxTokens)
	}
	return fmt.Sprintf(`{"model":"m","stream":%t,%s"ignore_eos":true,"messages":[{"role":"user","content":"fault matrix"}]}`, stream, mt)
}

// clientView is what one client saw.
type clientView struct {
	status     int
	id         string // X-Request-Id
	replica    string // X-Gpurouter-Replica
	body       string // a non-stream response body
	events     int    // data events before [DONE], error events included
	errCode    string // the code of the stream's error event ("" when none)
	done       bool   // the stream ended with data: [DONE]
	err        error  // transport error
	duration   time.Duration
	retryAfter time.Duration // Retry-After of a refusal
}

// post sends body to the router's chat endpoint and reads the whole
// answer, streamed or not. each, if not nil, sees the view after every
// stream event and hangs up by returning false.
func post(ctx context.Context, c *http.Client, base, body string, each func(*clientView) bool) (v clientView) {
	start := time.Now()
	defer func() { v.duration = time.Since(start) }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		v.err = err
		return v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		v.err = err
		return v
	}
	defer resp.Body.Close()
	v.status, v.id, v.replica = resp.StatusCode, resp.Header.Get("X-Request-Id"), resp.Header.Get("X-Gpurouter-Replica")
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		v.retryAfter = time.Duration(ra) * time.Second
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(resp.Body)
		v.body, v.err = string(b), err
		return v
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			v.done = true
			continue
		}
		v.events++
		if code, ok := errorCode(data); ok {
			v.errCode = code
		}
		if each != nil && !each(&v) {
			return v // the deferred Close hangs up mid-stream
		}
	}
	v.err = sc.Err()
	return v
}

// errorCode reads {"error":{"code":...}}; ok is false for other events.
func errorCode(data string) (string, bool) {
	if !strings.HasPrefix(data, `{"error"`) {
		return "", false
	}
	var e struct {
		Error struct {
			Code json.RawMessage `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(data), &e); err != nil {
		return "unparsable", true
	}
	return strings.Trim(string(e.Error.Code), `"`), true
}

// debugReplica is a replica in /debug/pools.
type debugReplica struct {
	Name     string `json:"name"`
	Healthy  bool   `json:"healthy"`
	Breaker  string `json:"breaker"`
	InFlight int64  `json:"in_flight"`
	Served   int64  `json:"served"`
	Engine   *struct {
		Running, Waiting int
		KVUsage          float64
		KVCapacityTokens int64
		At               time.Time
	} `json:"engine"`
}

// replicas returns the first pool's replicas from /debug/pools, by name.
func (tr *testRouter) replicas() map[string]debugReplica {
	tr.t.Helper()
	var doc struct {
		Pools []struct {
			InFlight int64          `json:"in_flight"`
			Replicas []debugReplica `json:"replicas"`
		} `json:"pools"`
	}
	getJSON(tr.t, tr.base+"/debug/pools", &doc)
	out := map[string]debugReplica{}
	for _, r := range doc.Pools[0].Replicas {
		out[r.Name] = r
	}
	return out
}

// requests sums gpurouter_requests_total over the series whose labels
// include every given name=value pair ("outcome", "timeout", ...).
func (tr *testRouter) requests(pairs ...string) int {
	tr.t.Helper()
	return int(sumMetric(tr.t, tr.base+"/metrics", "gpurouter_requests_total", pairs...))
}

// sumMetric scrapes url and sums the samples of metric whose labels
// include every name=value pair given.
func sumMetric(t testing.TB, url, metric string, pairs ...string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, metric)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		for i := 0; i+1 < len(pairs); i += 2 {
			if !strings.Contains(rest, pairs[i]+`="`+pairs[i+1]+`"`) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", url, line, err)
		}
		sum += v
	}
	return sum
}

// eventually polls cond every 10ms until it holds or d passes: the bounded
// wait for an effect the tests use instead of sleeping.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// idle reports whether the router holds nothing for any request: no
// exchange active, nothing in flight on any replica, no admission queue
// or admitted ticket left.
func (tr *testRouter) idle() (bool, string) {
	routes := tr.r.fleet.Routes()
	if n := tr.r.srv.Active(); n != 0 {
		return false, fmt.Sprintf("%d requests active", n)
	}
	for _, rt := range routes {
		p := rt.Pool
		if n := p.InFlight(); n != 0 {
			return false, fmt.Sprintf("pool %s: %d in flight", p.Model(), n)
		}
		for _, rep := range p.Replicas() {
			if n := rep.InFlight(); n != 0 {
				return false, fmt.Sprintf("replica %s: %d in flight", rep.Name(), n)
			}
		}
	}
	for _, rt := range routes {
		if rt.Admission == nil {
			continue
		}
		if s := rt.Admission.Stats(); s.Queued != 0 || s.InFlight != 0 {
			return false, fmt.Sprintf("admission %s: %d queued, %d admitted", s.Model, s.Queued, s.InFlight)
		}
	}
	return true, ""
}

// waitIdle waits (bounded) until the router holds nothing.
func (tr *testRouter) waitIdle(d time.Duration) {
	tr.t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, why := tr.idle()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tr.t.Fatalf("after %v the router still holds requests: %s", d, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
