package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/admission"
	"github.com/gpurouter/gpurouter/balancer"
	"github.com/gpurouter/gpurouter/gpu"
	"github.com/gpurouter/gpurouter/proxy"
)

// tables is a Router that keeps every table published to it.
type tables struct {
	mu  sync.Mutex
	all [][]proxy.Route
}

func (t *tables) SetRoutes(rs []proxy.Route) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all = append(t.all, rs)
	return nil
}

func (t *tables) last() []proxy.Route {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.all[len(t.all)-1]
}

// engine is a fake vLLM on loopback: /health, and /metrics reporting
// running requests as given.
func engine(t *testing.T, running int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} 0\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.1\n", running)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func onePool(reps ...Replica) Spec {
	return Spec{Pools: []Pool{{Model: "m", Policy: "round_robin", Replicas: reps}}, Admission: &admission.Config{}}
}

func newFleet(t *testing.T, s Spec) (*Fleet, *tables) {
	t.Helper()
	f, err := New(s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tb := &tables{}
	if err := f.Attach(tb); err != nil {
		t.Fatal(err)
	}
	return f, tb
}

func replicaNames(f *Fleet) []string {
	var out []string
	for _, r := range f.Replicas() {
		out = append(out, r.Name())
	}
	return out
}

// A change keeps what it does not change: replicas by name, URL and
// weight (their counts and drain flag), the pool while the score is the
// same, the admission controller (its queue) while its config is.
func TestUpdateCarriesOverWhatIsUnchanged(t *testing.T) {
	a, b := Replica{Name: "a", URL: "http://127.0.0.1:1"}, Replica{Name: "b", URL: "http://127.0.0.1:2"}
	f, tb := newFleet(t, onePool(a, b))
	before := tb.last()[0]
	ra := f.Replica("m", "a")
	ra.SetDraining(true)

	tests := []struct {
		name                      string
		change                    func(*Spec)
		samePool, sameCtl, sameRA bool
	}{
		{"policy", func(s *Spec) { s.Pools[0].Policy = "p2c" }, true, true, true},
		{"a replica added", func(s *Spec) {
			s.Pools[0].Replicas = append(s.Pools[0].Replicas, Replica{Name: "c", URL: "http://127.0.0.1:3"})
		}, true, true, true},
		{"a's weight", func(s *Spec) { s.Pools[0].Replicas[0].Weight = 2 }, true, true, false},
		{"admission", func(s *Spec) { s.Admission.MaxInFlight = 7 }, true, false, true},
		{"score", func(s *Spec) { s.Score.WaitingWeight = 9 }, false, false, true},
		{"aliases", func(s *Spec) { s.Pools[0].Aliases = []string{"mm"} }, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := onePool(a, b)
			tt.change(&spec)
			if err := f.Reload(spec); err != nil {
				t.Fatal(err)
			}
			now := tb.last()[0]
			if (now.Pool == before.Pool) != tt.samePool || (now.Admission == before.Admission) != tt.sameCtl || (f.Replica("m", "a") == ra) != tt.sameRA {
				t.Fatalf("pool kept %v, controller kept %v, replica a kept %v; want %v %v %v",
					now.Pool == before.Pool, now.Admission == before.Admission, f.Replica("m", "a") == ra, tt.samePool, tt.sameCtl, tt.sameRA)
			}
			if tt.sameRA && !f.Replica("m", "a").Draining() {
				t.Fatal("a kept replica lost its drain flag")
			}
			// Back to the start for the next row; the start's objects may
			// be new ones.
			if err := f.Reload(onePool(a, b)); err != nil {
				t.Fatal(err)
			}
			before, ra = tb.last()[0], f.Replica("m", "a")
			ra.SetDraining(true)
		})
	}
}

// The output cap travels in the route table with its pool: one publish
// carries both.
func TestMaxTokensInTheRouteTable(t *testing.T) {
	spec := onePool(Replica{URL: "http://127.0.0.1:1"})
	spec.Pools[0].MaxTokens = 64
	f, tb := newFleet(t, spec)
	if got := tb.last()[0].MaxTokens; got != 64 {
		t.Fatalf("cap %d published, want 64", got)
	}
	spec.Pools[0].MaxTokens = 4
	n := len(tb.all)
	if err := f.Reload(spec); err != nil {
		t.Fatal(err)
	}
	if len(tb.all) != n+1 || tb.last()[0].MaxTokens != 4 || f.Routes()[0].MaxTokens != 4 {
		t.Fatalf("after the change: %d publishes, cap %d", len(tb.all)-n, tb.last()[0].MaxTokens)
	}
}

// An edit is refused for what the file would be refused for, with the
// file's words, and the state stays as it was.
func TestEditsValidated(t *testing.T) {
	f, tb := newFleet(t, onePool(Replica{Name: "a", URL: "http://127.0.0.1:1"}))
	n := len(tb.all)
	tests := []struct {
		name string
		edit func() error
		want string
		is   error
	}{
		{"bad URL", func() error { return f.AddReplica("m", Replica{Name: "b", URL: "ftp://x"}) }, "pools[0].replicas[1].url: must be an absolute http", nil},
		{"duplicate name", func() error { return f.AddReplica("m", Replica{Name: "a", URL: "http://127.0.0.1:2"}) }, `pools[0].replicas[1].name: "a" already used by replicas[0]`, nil},
		{"duplicate URL", func() error { return f.AddReplica("m", Replica{Name: "b", URL: "http://127.0.0.1:1/"}) }, "duplicates replicas[0]", nil},
		{"bad weight", func() error { return f.AddReplica("m", Replica{Name: "b", URL: "http://127.0.0.1:2", Weight: -1}) }, "weight: must be a finite number > 0", nil},
		{"unknown policy", func() error { return f.SetPolicy("m", "fastest", nil) }, `pools[0].policy: unknown policy "fastest"`, nil},
		{"arm share", func() error {
			return f.SetPolicy("m", "", []balancer.Arm{{Name: "x", Policy: "p2c", Share: -1}, {Name: "y", Policy: "p2c"}})
		}, "pools[0].arms[0].share: must be > 0", nil},
		{"one arm", func() error { return f.SetPolicy("m", "", []balancer.Arm{{Name: "x", Policy: "p2c"}}) }, "at least two arms", nil},
		{"no pool", func() error { return f.AddReplica("z", Replica{URL: "http://127.0.0.1:2"}) }, `"z"`, ErrNoPool},
		{"no replica", func() error { return f.RemoveReplica("m", "zz") }, `"zz"`, ErrNoReplica},
		{"last replica", func() error { return f.RemoveReplica("m", "a") }, "at least one replica", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.edit()
			if err == nil || !strings.Contains(err.Error(), tt.want) || (tt.is != nil && !errors.Is(err, tt.is)) {
				t.Fatalf("error %v, want one with %q", err, tt.want)
			}
			if len(tb.all) != n || !slices.Equal(replicaNames(f), []string{"a"}) || f.Routes()[0].Pool.Policy() != "round_robin" {
				t.Fatalf("a refused edit changed the state: %d publishes, replicas %v", len(tb.all)-n, replicaNames(f))
			}
		})
	}
	t.Run("defaults as in the file", func(t *testing.T) {
		if err := f.AddReplica("m", Replica{URL: "http://127.0.0.1:2"}); err != nil {
			t.Fatal(err)
		}
		r := f.Replica("m", "127.0.0.1:2")
		if r == nil || r.Weight() != 1 {
			t.Fatalf("replicas %v", replicaNames(f))
		}
		if err := f.SetPolicy("m", "", []balancer.Arm{{Name: "x", Policy: "p2c"}, {Name: "y", Policy: "round_robin", Share: 3}}); err != nil {
			t.Fatal(err)
		}
		if arms := f.Spec().Pools[0].Arms; arms[0].Share != 1 {
			t.Fatalf("arms %+v: a zero share is 1", arms)
		}
	})
}

// Edits and reloads from a changing source, all at once: each applies to
// the state current when it takes effect, so no edit is lost to another
// working on a stale copy, and a reload that reads its source under the
// lock never drops an edit whose replica its source already has.
func TestConcurrentEditsAndReloadsLoseNothing(t *testing.T) {
	const edits, reloads = 40, 20
	var srcMu sync.Mutex
	src := []Replica{{Name: "r0", URL: "http://127.0.0.1:1"}}
	read := func() Spec {
		srcMu.Lock()
		defer srcMu.Unlock()
		return onePool(slices.Clone(src)...)
	}
	f, _ := newFleet(t, read())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var applied []string
	for i := range edits {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := Replica{Name: fmt.Sprintf("e%02d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 100+i)}
			srcMu.Lock()
			src = append(src, r) // the source has it before the edit is asked
			srcMu.Unlock()
			err := f.AddReplica("m", r)
			switch {
			case err == nil:
				if f.Replica("m", r.Name) == nil {
					t.Errorf("edit %s applied but not live", r.Name)
				}
				mu.Lock()
				applied = append(applied, r.Name)
				mu.Unlock()
			case !strings.Contains(err.Error(), "already used"): // a reload added it first
				t.Errorf("edit %s: %v", r.Name, err)
			}
		}()
	}
	for range reloads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.Update(Change{Next: func(Spec) (Spec, error) { return read(), nil }}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	live := replicaNames(f)
	for _, name := range applied {
		if !slices.Contains(live, name) {
			t.Errorf("edit %s answered applied is not live", name)
		}
	}
	if len(live) != edits+1 {
		t.Errorf("%d replicas live, want %d: %v", len(live), edits+1, live)
	}
}

// Run runs the loops of the current state: the poller of a replica added
// later scrapes it, the poller it replaced stops; Run returns when its
// context ends, and a second Run is refused.
func TestRunFollowsTheState(t *testing.T) {
	spec := onePool(Replica{Name: "a", URL: engine(t, 3)})
	spec.Telemetry = &gpu.PollerConfig{Interval: 10 * time.Millisecond}
	f, _ := newFleet(t, spec)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	scraped := func(name string, running int) bool {
		r := f.Replica("m", name)
		return r != nil && r.EngineLoad() != nil && r.EngineLoad().Running == running
	}
	eventually(t, "a never scraped", func() bool { return scraped("a", 3) })
	if err := f.AddReplica("m", Replica{Name: "b", URL: engine(t, 5)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b, added later, never scraped", func() bool { return scraped("b", 5) })
	if err := f.Run(ctx); !errors.Is(err, errRunning) {
		t.Fatalf("a second Run: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// eventually polls cond until it holds, for at most 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
