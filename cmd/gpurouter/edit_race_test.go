package main

// Admin edits racing file reloads, under request load. What an operator
// may rely on, and what this test checks:
//
//   - a reload applies the file as it is when the reload takes effect;
//   - an admin edit applies to the desired state as it is when the edit
//     takes effect: it is never applied to a stale copy, so it cannot undo
//     a concurrent edit or reload;
//   - hence an edit answered "applied" stays live until a later reload of
//     a file without it.
//
// The operator here writes each replica into the file before asking the
// admin API to add it (as a careful operator would, so a SIGHUP keeps it).
// No correct interleaving then ever removes a replica: every edit answered
// "applied" must be live from its answer to the end, and at the end the
// live pool is exactly the file's. An edit may instead be refused because
// a reload already added its replica from the file ("already used").

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
)

// fakeEngine is an upstream on loopback that answers /health, a minimal
// vLLM /metrics and any completion with a fixed one-token answer.
func fakeEngine(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		switch r.URL.Path {
		case "/health":
		case "/metrics":
			io.WriteString(w, "vllm:num_requests_running{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 0\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0\n") //nolint:errcheck
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`) //nolint:errcheck
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// operatorFile is the configuration file the operator edits: one pool
// whose replicas only ever grow. Writes are atomic (rename), so a reload
// reads either the old file or the new one.
type operatorFile struct {
	t    *testing.T
	path string
	mu   sync.Mutex
	reps []replicaConfig
}

func (f *operatorFile) add(rc replicaConfig) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reps = append(f.reps, rc)
	var b strings.Builder
	b.WriteString("log: {level: error}\nhealth: {interval: 50ms}\ntelemetry: {interval: 50ms}\npools:\n  - model: m\n    policy: round_robin\n    replicas:\n")
	for _, r := range f.reps {
		fmt.Fprintf(&b, "      - {url: %q, name: %q}\n", r.URL, r.Name)
	}
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		f.t.Error(err)
		return
	}
	if err := os.Rename(tmp, f.path); err != nil {
		f.t.Error(err)
	}
}

func (f *operatorFile) names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.reps {
		out = append(out, r.Name)
	}
	slices.Sort(out)
	return out
}

// 40 admin edits (each adds a replica of its own), 20 file reloads by the
// path SIGHUP takes, and 300 requests, all at once.
func TestAdminEditsRaceReloads(t *testing.T) {
	const (
		edits, editors   = 40, 8
		reloads, hups    = 20, 2
		requests, client = 300, 8
	)
	file := &operatorFile{t: t, path: filepath.Join(t.TempDir(), "gpurouter.yaml")}
	file.add(replicaConfig{URL: fakeEngine(t), Name: "r0"})
	file.add(replicaConfig{URL: fakeEngine(t), Name: "r1"})
	extra := make([]string, edits)
	for i := range extra {
		extra[i] = fakeEngine(t)
	}

	cfg, err := loadConfigFile(file.path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRouter(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	base := runRouter(t, r)
	// What serve's SIGHUP loop and POST /admin/reload run.
	reload := func() error {
		return r.reloadFrom(func() (fileConfig, error) { return loadConfigFile(file.path) })
	}
	const token = "admin-token-0123456789"
	adminURL := runAdmin(t, r, token, reload)
	// Its own client, whose idle connections go before the servers stop:
	// shutdowns wait for open connections.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: editors + client}}
	t.Cleanup(hc.CloseIdleConnections)

	live := func() []string {
		req, _ := http.NewRequest("GET", adminURL+"/admin/state", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Error(err)
			return nil
		}
		defer resp.Body.Close()
		var st struct {
			Pools []struct{ Replicas []struct{ Name string } }
		}
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Error(err)
			return nil
		}
		var out []string
		for _, p := range st.Pools {
			for _, rep := range p.Replicas {
				out = append(out, rep.Name)
			}
		}
		slices.Sort(out)
		return out
	}

	deadline := time.Now().Add(10 * time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var applied, refused []string
	var lost []string // applied, yet missing right after the answer
	next := make(chan int, edits)
	for i := range edits {
		next <- i
	}
	close(next)
	for range editors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				name := fmt.Sprintf("e%02d", i)
				file.add(replicaConfig{URL: extra[i], Name: name})
				body := fmt.Sprintf(`{"url":%q,"name":%q}`, extra[i], name)
				req, _ := http.NewRequest("POST", adminURL+"/admin/pools/m/replicas", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := hc.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				msg, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == 200 && strings.Contains(string(msg), "applied"):
					now := live()
					mu.Lock()
					applied = append(applied, name)
					if !slices.Contains(now, name) {
						lost = append(lost, name)
					}
					mu.Unlock()
				case resp.StatusCode == 400 && strings.Contains(string(msg), "already used"):
					mu.Lock()
					refused = append(refused, name) // a reload added it first
					mu.Unlock()
				default:
					t.Errorf("edit %s: status %d: %s", name, resp.StatusCode, msg)
				}
			}
		}()
	}
	for range hups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range reloads / hups {
				if err := reload(); err != nil {
					t.Errorf("reload: %v", err)
				}
			}
		}()
	}
	reqs := make(chan struct{}, requests)
	for range requests {
		reqs <- struct{}{}
	}
	close(reqs)
	var failed []string
	for range client {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range reqs {
				if time.Now().After(deadline) {
					return
				}
				resp, err := hc.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
				if err != nil {
					t.Error(err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("%d %s", resp.StatusCode, b))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if time.Now().After(deadline) {
		t.Errorf("the race took longer than its 10s bound")
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed during the edits, e.g. %s", len(failed), requests, failed[0])
	}
	t.Logf("%d edits applied, %d refused because a reload had added the replica first", len(applied), len(refused))
	slices.Sort(lost)
	if len(lost) > 0 {
		t.Errorf("%d edits answered \"applied\" were not live right after: %v", len(lost), lost)
	}
	now := live()
	for _, name := range applied {
		if !slices.Contains(now, name) {
			t.Errorf("edit %s answered \"applied\" is not live at the end", name)
		}
	}
	if want := file.names(); !slices.Equal(now, want) {
		t.Errorf("live replicas at the end:\n%v\nthe file's:\n%v", now, want)
	}
}
