package bench

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func fixedRequests(n, out int) []Request {
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Prompt: "Say something.", PromptTokens: 3, OutputTokens: out, UseCase: "qa"}
	}
	return reqs
}

func meanDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s / time.Duration(len(ds))
}

func TestRunMeasuresUpstreamTiming(t *testing.T) {
	const tokens, gap, first = 6, 20 * time.Millisecond, 30 * time.Millisecond
	tests := []struct {
		name       string
		endpoint   string
		anyChoice  bool
		wantChunks int
	}{
		{"completions", EndpointCompletions, false, tokens},
		{"chat", EndpointChat, false, tokens},
		{"chat counting every choice chunk like vllm", EndpointChat, true, tokens + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := startUpstream(t, func(string) sseScript { return sseScript{firstDelay: first, tokens: tokens, gap: gap} })
			res, err := Run(context.Background(), Config{
				BaseURL: up.url, Endpoint: tt.endpoint, Model: "m", Requests: fixedRequests(2, 16),
				MaxConcurrency: 1, IgnoreEOS: true, RequestIDPrefix: "t-", CountEmptyChunks: tt.anyChoice,
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Records) != 2 || res.MaxInFlight != 1 {
				t.Fatalf("%d records, max in flight %d", len(res.Records), res.MaxInFlight)
			}
			for _, rec := range res.Records {
				if !rec.OK() {
					t.Fatalf("%s failed: %s %s", rec.ID, rec.Reason, rec.Error)
				}
				if rec.Chunks != tt.wantChunks || rec.OutputTokens != tokens || !rec.UsageReported || rec.PromptTokens != 7 || len(rec.ITLs) != tt.wantChunks-1 {
					t.Fatalf("%s: chunks %d, output %d (usage %v), prompt %d, %d ITLs", rec.ID, rec.Chunks, rec.OutputTokens, rec.UsageReported, rec.PromptTokens, len(rec.ITLs))
				}
				l := up.log(rec.ID)
				if l == nil || l.path != tt.endpoint {
					t.Fatalf("upstream did not see %s on %s", rec.ID, tt.endpoint)
				}
				var body map[string]any
				if err := json.Unmarshal([]byte(l.body), &body); err != nil {
					t.Fatalf("body %q: %v", l.body, err)
				}
				so, _ := body["stream_options"].(map[string]any)
				if body["model"] != "m" || body["stream"] != true || body["max_tokens"] != 16.0 || body["ignore_eos"] != true || so["include_usage"] != true {
					t.Fatalf("body %s", l.body)
				}
				_, hasMsgs := body["messages"]
				if hasMsgs != (tt.endpoint == EndpointChat) {
					t.Fatalf("chat body mismatch: %s", l.body)
				}
				// The client sends before the server receives and receives
				// after the server sends, so client latencies bound the
				// server-side ones from above.
				if srvTTFT := l.sends[0].Sub(l.recv); rec.TTFT < srvTTFT && !tt.anyChoice {
					t.Errorf("client TTFT %v < upstream's %v", rec.TTFT, srvTTFT)
				}
				if srvE2E := l.sends[len(l.sends)-1].Sub(l.recv); rec.E2E < srvE2E {
					t.Errorf("client E2E %v < upstream's %v", rec.E2E, srvE2E)
				}
				var sum time.Duration
				for _, d := range rec.ITLs {
					sum += d
				}
				if sum != rec.E2E-rec.TTFT {
					t.Errorf("ITLs sum to %v, E2E−TTFT = %v", sum, rec.E2E-rec.TTFT)
				}
				if tt.anyChoice {
					continue
				}
				var srvGaps []time.Duration
				for i := 1; i < len(l.sends); i++ {
					srvGaps = append(srvGaps, l.sends[i].Sub(l.sends[i-1]))
				}
				// Mean gaps agree: jitter only enters at the two ends.
				c, s := meanDur(rec.ITLs), meanDur(srvGaps)
				if diff := c - s; diff < -s/2 || diff > s/2 {
					t.Errorf("mean ITL %v vs upstream gap %v", c, s)
				}
			}
		})
	}
}

func TestRunFailures(t *testing.T) {
	tests := []struct {
		name       string
		script     sseScript
		timeout    time.Duration
		wantReason string
		wantErr    string
	}{
		{"http 503", sseScript{status: 503}, 0, "http_503", "scripted 503"},
		{"no [DONE]", sseScript{tokens: 3, noDone: true}, 0, ReasonBrokenStream, "[DONE]"},
		{"error in stream", sseScript{tokens: 5, errorAfter: 2}, 0, ReasonStreamError, "engine died"},
		{"no output", sseScript{tokens: 0}, 0, ReasonNoContent, "no chunk"},
		{"timeout", sseScript{tokens: 2, firstDelay: 400 * time.Millisecond}, 50 * time.Millisecond, ReasonTimeout, ""},
		{"no usage is fine", sseScript{tokens: 4, noUsage: true}, 0, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := startUpstream(t, func(string) sseScript { return tt.script })
			res, err := Run(context.Background(), Config{BaseURL: up.url, Model: "m", Requests: fixedRequests(1, 8), Timeout: tt.timeout})
			if err != nil {
				t.Fatal(err)
			}
			rec := res.Records[0]
			if rec.Reason != tt.wantReason || !strings.Contains(rec.Error, tt.wantErr) {
				t.Fatalf("reason %q error %q, want %q mentioning %q", rec.Reason, rec.Error, tt.wantReason, tt.wantErr)
			}
			if tt.wantReason == "" && (!rec.OK() || rec.UsageReported || rec.OutputTokens != 4) {
				t.Fatalf("without usage: ok %v, usage %v, output %d (want chunk count 4)", rec.OK(), rec.UsageReported, rec.OutputTokens)
			}
		})
	}
	t.Run("connection refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		res, err := Run(context.Background(), Config{BaseURL: "http://" + addr, Model: "m", Requests: fixedRequests(2, 8)})
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range res.Records {
			if rec.Reason != ReasonConnect {
				t.Fatalf("reason %q (%s), want connect", rec.Reason, rec.Error)
			}
		}
	})
}

func TestRunMaxConcurrencyAndWarmups(t *testing.T) {
	// Streams stall after their first token until three measured requests
	// have reached the upstream, so three must be in flight at once.
	hold := make(chan struct{})
	var mu sync.Mutex
	seen := map[string]bool{}
	measured := 0
	up := startUpstream(t, func(id string) sseScript {
		mu.Lock()
		defer mu.Unlock()
		seen[id] = true
		if strings.Contains(id, "warmup") {
			return sseScript{tokens: 2}
		}
		if measured++; measured == 3 {
			close(hold)
		}
		return sseScript{tokens: 2, hold: hold}
	})
	res, err := Run(context.Background(), Config{BaseURL: up.url, Model: "m", Requests: fixedRequests(12, 4), MaxConcurrency: 3, NumWarmups: 2, RequestIDPrefix: "w-"})
	if err != nil {
		t.Fatal(err)
	}
	if res.MaxInFlight != 3 {
		t.Fatalf("max in flight %d, want 3", res.MaxInFlight)
	}
	if len(res.Warmups) != 2 || !seen["w-warmup-0"] || !seen["w-warmup-1"] || !res.Warmups[0].OK() {
		t.Fatalf("warm-ups %+v", res.Warmups)
	}
	queued := 0
	for _, rec := range res.Records {
		if !rec.OK() {
			t.Fatalf("%s: %s", rec.ID, rec.Error)
		}
		if rec.ClientQueue > 0 {
			queued++
		}
		if rec.Sent < rec.Scheduled+rec.ClientQueue || rec.Lag < 0 {
			t.Fatalf("%s sent at %v before scheduled %v + queue %v", rec.ID, rec.Sent, rec.Scheduled, rec.ClientQueue)
		}
	}
	if queued == 0 {
		t.Fatal("no request waited for one of the 3 slots")
	}
	if s := Summarize(res, MetricOptions{}); s.MaxConcurrentRequests > 3 || s.Completed != 12 {
		t.Fatalf("summary: peak %d, completed %d", s.MaxConcurrentRequests, s.Completed)
	}
}

func TestRunTimedArrivals(t *testing.T) {
	up := startUpstream(t, func(string) sseScript { return sseScript{tokens: 1} })
	reqs := fixedRequests(3, 1)
	for i := range reqs {
		reqs[i].Arrival = time.Duration(i) * 40 * time.Millisecond
	}
	res, err := Run(context.Background(), Config{BaseURL: up.url, Model: "m", Requests: reqs, Timed: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, rec := range res.Records {
		if rec.Scheduled != reqs[i].Arrival || rec.Sent < rec.Scheduled || rec.Lag < 0 {
			t.Fatalf("record %d: scheduled %v sent %v lag %v", i, rec.Scheduled, rec.Sent, rec.Lag)
		}
	}
	if res.Duration < 80*time.Millisecond {
		t.Fatalf("duration %v shorter than the trace", res.Duration)
	}
}

func TestRunCancelClosesStreams(t *testing.T) {
	hold := make(chan struct{}) // never closed: streams stall after one token
	defer close(hold)
	arrived := make(chan struct{}, 4)
	up := startUpstream(t, func(string) sseScript {
		arrived <- struct{}{}
		return sseScript{tokens: 3, hold: hold}
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for range 4 {
			<-arrived
		}
		cancel()
	}()
	res, err := Run(ctx, Config{BaseURL: up.url, Model: "m", Requests: fixedRequests(4, 3)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	for _, rec := range res.Records {
		if rec.Reason != ReasonCanceled {
			t.Fatalf("%s: reason %q (%s), want canceled", rec.ID, rec.Reason, rec.Error)
		}
	}
}

// TestRun2000ConcurrentStreams holds every stream open until all 2,000 have
// reached the upstream, so the generator must really carry them at once.
func TestRun2000ConcurrentStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("2,000 connections")
	}
	const n = 2000
	hold := make(chan struct{})
	var mu sync.Mutex
	count := 0
	up := startUpstream(t, func(string) sseScript {
		mu.Lock()
		count++
		if count == n {
			close(hold)
		}
		mu.Unlock()
		return sseScript{tokens: 3, hold: hold}
	})
	res, err := Run(context.Background(), Config{BaseURL: up.url, Model: "m", Requests: fixedRequests(n, 3)})
	if err != nil {
		t.Fatal(err)
	}
	if res.MaxInFlight != n {
		t.Fatalf("max in flight %d, want %d", res.MaxInFlight, n)
	}
	for _, rec := range res.Records {
		if !rec.OK() || rec.OutputTokens != 3 {
			t.Fatalf("%s: %s %s (output %d)", rec.ID, rec.Reason, rec.Error, rec.OutputTokens)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{BaseURL: "http://127.0.0.1:1", Model: "m", Requests: fixedRequests(1, 1)}
	tests := []struct {
		name string
		mut  func(*Config)
		want string
	}{
		{"bad url", func(c *Config) { c.BaseURL = "127.0.0.1:8000" }, "base URL"},
		{"no model", func(c *Config) { c.Model = "" }, "no model"},
		{"no requests", func(c *Config) { c.Requests = nil }, "no requests"},
		{"negative rate", func(c *Config) { c.RequestRate = -1 }, "request rate"},
		{"zero output", func(c *Config) { c.Requests = []Request{{Prompt: "x"}} }, "output tokens"},
		{"synth without estimator", func(c *Config) { c.Requests = []Request{{PromptTokens: 5, OutputTokens: 1}} }, "Estimator"},
		{"endpoint", func(c *Config) { c.Endpoint = "v1/completions" }, "endpoint"},
	}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mut(&c)
			err := c.Validate()
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrConfig mentioning %q", err, tt.want)
			}
		})
	}
}
