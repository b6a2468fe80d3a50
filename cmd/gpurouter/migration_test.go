package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// Streams that outlive their replica, through the router as serve builds
// it (migration on by default) over simulated engines whose text is a
// function of each request's seed: a stream that moved must read exactly
// as one that did not.

const migTokens = 400

// migView is what one client saw, whichever way it asked.
type migView struct {
	text     string
	ids      map[string]bool
	usage    [2]int64 // prompt, completion; zero when none came
	errEvent string   // an error event's code, or the client's error
	done     bool     // the stream ended with [DONE] (a whole answer: 200)
	leaked   bool     // token ids the client did not ask for
}

// migClient is one of the ways a client asks: raw HTTP or the official
// SDK, chat or completions, streamed or not. seed makes its text.
type migClient struct {
	name         string
	chat, stream bool
	sdk          bool
	usage        bool // ask for the usage chunk
}

var migClients = []migClient{
	{name: "chat", chat: true, stream: true, usage: true},
	{name: "completions", stream: true},
	{name: "sdk chat", chat: true, stream: true, sdk: true, usage: true},
	{name: "sdk completions", stream: true, sdk: true, usage: true},
}

func (c migClient) prompt(seed int) string { return fmt.Sprintf("Tell me about item %d", seed) }

// send runs the request and reads its answer; tokens counts the words as
// they arrive.
func (c migClient) send(base string, seed int, tokens *atomic.Int64) migView {
	if c.sdk {
		return c.sendSDK(base, seed, tokens)
	}
	v := migView{ids: map[string]bool{}}
	path, body := "/v1/completions", fmt.Sprintf(`"prompt":%q`, c.prompt(seed))
	if c.chat {
		path, body = "/v1/chat/completions", fmt.Sprintf(`"messages":[{"role":"user","content":%q}]`, c.prompt(seed))
	}
	opts := ""
	if c.usage {
		opts = `,"stream_options":{"include_usage":true}`
	}
	body = fmt.Sprintf(`{"model":"m","stream":%t%s,"max_tokens":%d,"ignore_eos":true,"seed":%d,%s}`, c.stream, opts, migTokens, seed, body)
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		v.errEvent = err.Error()
		return v
	}
	defer resp.Body.Close()
	type chunk struct {
		ID    string `json:"id"`
		Error *struct {
			Code string `json:"code"`
		} `json:"error"`
		Choices []struct {
			Delta   struct{ Content string } `json:"delta"`
			Message struct{ Content string } `json:"message"`
			Text    string                   `json:"text"`
		} `json:"choices"`
		Usage *struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	take := func(data string) {
		v.leaked = v.leaked || strings.Contains(data, "token_ids")
		var ch chunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			v.errEvent = "unparsable"
			return
		}
		if ch.Error != nil {
			v.errEvent = ch.Error.Code
			return
		}
		v.ids[ch.ID] = true
		if ch.Usage != nil {
			v.usage = [2]int64{ch.Usage.Prompt, ch.Usage.Completion}
		}
		for _, c := range ch.Choices {
			t := c.Delta.Content + c.Message.Content + c.Text
			v.text += t
			tokens.Add(int64(len(strings.Fields(t))))
		}
	}
	if !c.stream {
		var b strings.Builder
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			b.WriteString(sc.Text())
		}
		take(b.String())
		v.done = resp.StatusCode == 200 && v.errEvent == ""
		return v
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case data == "[DONE]":
			v.done = true
		default:
			take(data)
		}
	}
	return v
}

func (c migClient) sendSDK(base string, seed int, tokens *atomic.Int64) migView {
	v := migView{ids: map[string]bool{}}
	client := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := []option.RequestOption{option.WithJSONSet("ignore_eos", true)}
	usage := openai.ChatCompletionStreamOptionsParam{}
	if c.usage {
		usage.IncludeUsage = openai.Bool(true)
	}
	add := func(id, text string) {
		v.ids[id] = true
		v.text += text
		tokens.Add(int64(len(strings.Fields(text))))
	}
	var err error
	switch {
	case c.chat && c.stream:
		s := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(c.prompt(seed))},
			MaxTokens: openai.Int(migTokens), Seed: openai.Int(int64(seed)), StreamOptions: usage,
		}, opts...)
		for s.Next() {
			ch := s.Current()
			for _, x := range ch.Choices {
				add(ch.ID, x.Delta.Content)
			}
			if ch.Usage.CompletionTokens > 0 {
				v.usage = [2]int64{ch.Usage.PromptTokens, ch.Usage.CompletionTokens}
			}
		}
		err = s.Err()
	case c.stream:
		s := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(c.prompt(seed))},
			MaxTokens: openai.Int(migTokens), Seed: openai.Int(int64(seed)), StreamOptions: usage,
		}, opts...)
		for s.Next() {
			ch := s.Current()
			for _, x := range ch.Choices {
				add(ch.ID, x.Text)
			}
			if ch.Usage.CompletionTokens > 0 {
				v.usage = [2]int64{ch.Usage.PromptTokens, ch.Usage.CompletionTokens}
			}
		}
		err = s.Err()
	case c.chat:
		var res *openai.ChatCompletion
		res, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(c.prompt(seed))},
			MaxTokens: openai.Int(migTokens), Seed: openai.Int(int64(seed)),
		}, opts...)
		if err == nil {
			add(res.ID, res.Choices[0].Message.Content)
			v.usage = [2]int64{res.Usage.PromptTokens, res.Usage.CompletionTokens}
		}
	default:
		var res *openai.Completion
		res, err = client.Completions.New(ctx, openai.CompletionNewParams{
			Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(c.prompt(seed))},
			MaxTokens: openai.Int(migTokens), Seed: openai.Int(int64(seed)),
		}, opts...)
		if err == nil {
			add(res.ID, res.Choices[0].Text)
			v.usage = [2]int64{res.Usage.PromptTokens, res.Usage.CompletionTokens}
		}
	}
	if err != nil {
		v.errEvent = err.Error()
	}
	v.done = err == nil
	return v
}

// migRun sends every client's request at once; stream i is client
// clients[i%len] with seed 100+i.
func migRun(base string, clients []migClient, n int, tokens *atomic.Int64) []migView {
	views := make([]migView, n)
	var wg sync.WaitGroup
	for i := range views {
		wg.Add(1)
		go func() {
			defer wg.Done()
			views[i] = clients[i%len(clients)].send(base, 100+i, tokens)
		}()
	}
	wg.Wait()
	return views
}

// checkMigrated compares what clients saw with the uninterrupted run.
func checkMigrated(t *testing.T, clients []migClient, got, want []migView) {
	t.Helper()
	for i, g := range got {
		c, w := clients[i%len(clients)], want[i]
		switch {
		case !g.done || g.errEvent != "":
			t.Errorf("%s %d: done %v, error %q", c.name, i, g.done, g.errEvent)
		case len(strings.Fields(g.text)) != migTokens || g.text != w.text:
			t.Errorf("%s %d: %d tokens, the uninterrupted run's text: %v", c.name, i, len(strings.Fields(g.text)), g.text == w.text)
		case len(g.ids) != 1 || g.leaked:
			t.Errorf("%s %d: ids %v, token ids leaked %v", c.name, i, g.ids, g.leaked)
		case g.usage != w.usage || (c.usage || !c.stream) && g.usage[1] != migTokens:
			t.Errorf("%s %d: usage %v, uninterrupted %v", c.name, i, g.usage, w.usage)
		}
	}
}

// routerRecord is the part of /debug/requests these tests read.
type routerRecord struct {
	Outcome         string  `json:"outcome"`
	Stream          bool    `json:"stream"`
	Attempts        int     `json:"attempts"`
	Replica         string  `json:"replica"`
	TTFTS           float64 `json:"ttft_s"`
	CompletionToks  int     `json:"completion_tokens"`
	Migrations      int     `json:"migrations"`
	ReplicaChain    string  `json:"replica_chain"`
	MigrationStallS float64 `json:"migration_stall_s"`
	DoneNs          int64   `json:"done_unix_ns"`
}

func (tr *testRouter) records(since int64) []routerRecord {
	tr.t.Helper()
	var doc struct{ Records []routerRecord }
	getJSON(tr.t, fmt.Sprintf("%s/debug/requests?since=%d", tr.base, since), &doc)
	return doc.Records
}

// recordsN is records once n have been written, or after 5 s whatever is
// there: a stream's record is written when the router finishes it, just
// after the client has read its last byte.
func (tr *testRouter) recordsN(since int64, n int) []routerRecord {
	tr.t.Helper()
	rs := tr.records(since)
	for deadline := time.Now().Add(5 * time.Second); len(rs) < n && time.Now().Before(deadline); rs = tr.records(since) {
		time.Sleep(20 * time.Millisecond)
	}
	return rs
}

func pct(xs []float64, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return time.Duration(s[int(p*float64(len(s)-1))] * float64(time.Second)).Round(time.Millisecond)
}

// Acceptance 1, 2 and 4 of issue 18: 40 streams of 400 tokens — chat and
// completions, raw and through the openai-go SDK — one of two replicas
// killed at a random point. Every stream ends with [DONE] and no error
// event, with exactly the 400 tokens of an uninterrupted run, one id and
// exact usage. The stall at the switch is logged beside the pool's TTFT.
func TestMigrationKilledReplica(t *testing.T) {
	fleet := startSimFleet(t, 2, nil)
	cfg := faultConfig(fleet.URLs(), "round_robin")
	tr := startTestRouter(t, cfg, nil)
	const n = 40
	var none atomic.Int64
	since := time.Now().UnixNano()
	want := migRun(tr.base, migClients, n, &none)
	var ttfts []float64
	for _, r := range tr.records(since) {
		ttfts = append(ttfts, r.TTFTS)
	}
	for i, w := range want {
		if !w.done || len(strings.Fields(w.text)) != migTokens {
			t.Fatalf("uninterrupted %s %d: %+v", migClients[i%len(migClients)].name, i, w)
		}
	}

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 18))
	victim := rng.IntN(2)
	killAt := int64(n * (20 + rng.IntN(migTokens-60)))
	var seen atomic.Int64
	since = time.Now().UnixNano()
	done := make(chan []migView)
	go func() { done <- migRun(tr.base, migClients, n, &seen) }()
	eventually(t, time.Minute, "the streams never got far", func() bool { return seen.Load() >= killAt })
	fleet.Replicas()[victim].Crash(time.Minute)
	t.Logf("killed r%d after %d of %d tokens", victim, seen.Load(), n*migTokens)
	checkMigrated(t, migClients, <-done, want)

	var stalls []float64
	for _, r := range tr.recordsN(since, n) {
		switch {
		case r.Outcome == "migrated":
			stalls = append(stalls, r.MigrationStallS)
			if r.Migrations != 1 || r.ReplicaChain != fmt.Sprintf("r%d>r%d", victim, 1-victim) || r.CompletionToks != migTokens {
				t.Errorf("migrated record %+v", r)
			}
		case r.Outcome != "ok":
			t.Errorf("record %+v", r)
		}
	}
	if len(stalls) == 0 {
		t.Fatal("no stream moved")
	}
	if n := sumMetric(t, tr.base+"/metrics", "gpurouter_migrations_total", "result", "continued"); int(n) != len(stalls) {
		t.Errorf("gpurouter_migrations_total{result=continued} %v, %d records migrated", n, len(stalls))
	}
	t.Logf("%d of %d streams moved; stall at the switch p50 %v p99 %v; the pool's TTFT (the same %d streams, nothing killed) p50 %v p99 %v; scrape interval %v",
		len(stalls), n, pct(stalls, 0.5), pct(stalls, 0.99), n, pct(ttfts, 0.5), pct(ttfts, 0.99), cfg.Telemetry.Interval)
}

// Acceptance 2 of issue 18, not streamed: requests of 400 tokens, raw and
// through the SDK, one of two replicas killed mid-generation: those it
// held are re-sent whole to the other and answer exactly as an
// uninterrupted run.
func TestMigrationKilledReplicaNotStreamed(t *testing.T) {
	fleet := startSimFleet(t, 2, nil)
	tr := startTestRouter(t, faultConfig(fleet.URLs(), "round_robin"), nil)
	clients := []migClient{
		{name: "chat", chat: true}, {name: "completions"},
		{name: "sdk chat", chat: true, sdk: true}, {name: "sdk completions", sdk: true},
	}
	const n = 20
	var none atomic.Int64
	start := time.Now()
	want := migRun(tr.base, clients, n, &none)
	took := time.Since(start)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 19))
	since := time.Now().UnixNano()
	done := make(chan []migView)
	go func() { done <- migRun(tr.base, clients, n, &none) }()
	// The victim is the replica generating more of them (the policy may
	// have put them all on one), at a random point of its generation.
	victim := 0
	eventually(t, time.Minute, "no replica started generating", func() bool {
		for i, r := range fleet.Replicas() {
			if s := r.State(); s.Running >= 5 {
				victim = i
				return true
			}
		}
		return false
	})
	time.Sleep(time.Duration(rng.Int64N(int64(took / 10)))) // a random point of the generation, not synchronisation
	held := tr.replicas()[fmt.Sprintf("r%d", victim)].InFlight
	fleet.Replicas()[victim].Crash(time.Minute)
	checkMigrated(t, clients, <-done, want)
	// Those the victim held ended on the other replica: nothing finished
	// on the one killed mid-generation.
	survivor := fmt.Sprintf("r%d", 1-victim)
	for _, r := range tr.records(since) {
		if r.Outcome != "ok" || r.Replica != survivor {
			t.Errorf("record %+v", r)
		}
	}
	if held == 0 {
		t.Fatalf("r%d held no request when it was killed", victim)
	}
	t.Logf("r%d killed holding %d of %d requests: re-sent whole to %s", victim, held, n, survivor)
}

// Acceptance 3 of issue 18: a replica removed from its pool while 40 long
// streams run on it gets no new requests, and its streams, still running
// when the grace period ends, finish on the other replicas — with the
// uninterrupted text, after the grace period, not before.
func TestMigrationReplicaRemovedUnderStreams(t *testing.T) {
	const grace = 500 * time.Millisecond
	fleet := startSimFleet(t, 3, nil)
	urls := fleet.URLs()
	cfg := faultConfig(urls, "round_robin")
	cfg.Pools = []poolConfig{simPoolConfig(urls, 0)}
	cfg.Pools[0].Migration.DrainGrace = grace
	tr := startTestRouter(t, cfg, nil)
	clients := migClients
	const n = 40

	var none atomic.Int64
	want := migRun(tr.base, clients, n, &none)
	var seen atomic.Int64
	done := make(chan []migView)
	since := time.Now().UnixNano()
	go func() { done <- migRun(tr.base, clients, n, &seen) }()
	eventually(t, 30*time.Second, "the streams never started", func() bool { return seen.Load() >= n*20 })

	next := tr.r.config()
	next.Pools = []poolConfig{simPoolConfig(urls, 1, 2)}
	next.Pools[0].Migration.DrainGrace = grace
	applyDefaults(&next)
	removed := time.Now()
	if err := tr.r.reload(next); err != nil {
		t.Fatal(err)
	}
	got := <-done
	checkMigrated(t, clients, got, want)
	moved := 0
	for _, r := range tr.recordsN(since, n) {
		if r.Outcome != "migrated" || !strings.HasPrefix(r.ReplicaChain, "r0>") || r.Replica == "r0" {
			t.Errorf("record %+v: want every stream moved off r0", r)
			continue
		}
		moved++
		if at := time.Unix(0, r.DoneNs); at.Sub(removed) < grace {
			t.Errorf("stream done %v after r0 left: before the grace period", at.Sub(removed))
		}
	}
	if moved != n {
		t.Errorf("%d of %d streams moved", moved, n)
	}
	eventually(t, 5*time.Second, "r0 kept generating for streams that left it", func() bool {
		s := fleet.Replicas()[0].State()
		return s.Running+s.Waiting == 0
	})
}
