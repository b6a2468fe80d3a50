package balancer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// contractCase is one situation every Picker must handle the same way: the
// candidates, the request's clock, and the set of acceptable answers.
type contractCase struct {
	name string
	// setup builds the candidate slice on clock c.
	setup func(t *testing.T, c *fakeClock) []*balancer.Replica
	// after is Request.Now as an offset from t0; zeroNow sends a zero
	// Request.Now instead (the replica's own clock then decides).
	after   time.Duration
	zeroNow bool
	// want are the names a pick may return; empty means every pick is nil.
	want []string
}

func contractCases() []contractCase {
	return []contractCase{
		{
			name:  "nil candidates",
			setup: func(*testing.T, *fakeClock) []*balancer.Replica { return nil },
		},
		{
			name:  "empty candidates",
			setup: func(*testing.T, *fakeClock) []*balancer.Replica { return []*balancer.Replica{} },
		},
		{
			name: "all unhealthy",
			setup: func(t *testing.T, c *fakeClock) []*balancer.Replica {
				return []*balancer.Replica{
					newReplica(t, "a", c, replicaOpts{down: true}),
					newReplica(t, "b", c, replicaOpts{down: true}),
				}
			},
		},
		{
			name: "all breakers open",
			setup: func(t *testing.T, c *fakeClock) []*balancer.Replica {
				return []*balancer.Replica{
					newReplica(t, "a", c, replicaOpts{open: true}),
					newReplica(t, "b", c, replicaOpts{open: true}),
				}
			},
		},
		{
			name: "skips unhealthy",
			setup: func(t *testing.T, c *fakeClock) []*balancer.Replica {
				return []*balancer.Replica{
					newReplica(t, "down1", c, replicaOpts{down: true}),
					// The only available one is also the busiest: least_request
					// must still not fall back to an idle unavailable replica.
					newReplica(t, "up", c, replicaOpts{inFlight: 9}),
					newReplica(t, "down2", c, replicaOpts{down: true}),
				}
			},
			want: []string{"up"},
		},
		{
			name: "skips open breaker",
			setup: func(t *testing.T, c *fakeClock) []*balancer.Replica {
				return []*balancer.Replica{
					newReplica(t, "open1", c, replicaOpts{open: true}),
					newReplica(t, "closed1", c, replicaOpts{inFlight: 5}),
					newReplica(t, "open2", c, replicaOpts{open: true}),
					newReplica(t, "closed2", c, replicaOpts{inFlight: 5}),
				}
			},
			want: []string{"closed1", "closed2"},
		},
		{
			name: "breaker open just before its timeout",
			setup: func(t *testing.T, c *fakeClock) []*balancer.Replica {
				return []*balancer.Replica{newReplica(t, "a", c, replicaOpts{open: true})}
			},
			after: testBreaker.OpenTimeout - time.Nanosecond,
		},
		{
			name: "breaker pickable once its timeout passed",
			setup: func(t *testing.T, c *fakeClock) []*balancer.Replica {
				return []*balancer.Replica{
					newReplica(t, "expired", c, replicaOpts{open: true}),
					newReplica(t, "down", c, replicaOpts{down: true}),
				}
			},
			after: testBreaker.OpenTimeout + time.Nanosecond,
			want:  []string{"expired"},
		},
		{
			name: "zero Request.Now uses the replica clock",
			setup: func(t *testing.T, c *fakeClock) []*balancer.Replica {
				r := newReplica(t, "expired", c, replicaOpts{open: true})
				c.advance(testBreaker.OpenTimeout + time.Second)
				return []*balancer.Replica{r}
			},
			zeroNow: true,
			want:    []string{"expired"},
		},
		{
			name: "zero Request.Now before the timeout",
			setup: func(t *testing.T, c *fakeClock) []*balancer.Replica {
				return []*balancer.Replica{newReplica(t, "a", c, replicaOpts{open: true})}
			},
			zeroNow: true,
		},
		{
			name: "client faults never open the breaker",
			setup: func(t *testing.T, c *fakeClock) []*balancer.Replica {
				r := newReplica(t, "a", c, replicaOpts{})
				faults := []error{
					balancer.ErrNotReplicaFault,
					fmt.Errorf("client went away: %w", balancer.ErrNotReplicaFault),
					errors.Join(context.Canceled, balancer.ErrNotReplicaFault),
				}
				// Many more than ConsecutiveFailures, in a row.
				for i := range 4 * testBreaker.ConsecutiveFailures * len(faults) {
					l, err := r.Acquire()
					if err != nil {
						t.Fatalf("Acquire #%d: %v", i, err)
					}
					l.Done(faults[i%len(faults)])
				}
				if got := r.BreakerState(); got != "closed" {
					t.Fatalf("breaker %s after client faults, want closed", got)
				}
				return []*balancer.Replica{r}
			},
			want: []string{"a"},
		},
		{
			name: "a success resets the failure streak",
			setup: func(t *testing.T, c *fakeClock) []*balancer.Replica {
				r := newReplica(t, "a", c, replicaOpts{})
				for i, err := range []error{errors.New("x"), nil, errors.New("x"), nil} {
					l, aerr := r.Acquire()
					if aerr != nil {
						t.Fatalf("Acquire #%d: %v", i, aerr)
					}
					l.Done(err)
				}
				return []*balancer.Replica{r}
			},
			want: []string{"a"},
		},
	}
}

// TestPickerContract runs the same situations over every policy NewPicker
// knows, so a new policy gets the contract for free.
func TestPickerContract(t *testing.T) {
	for _, policy := range balancer.Policies() {
		t.Run(policy, func(t *testing.T) {
			for _, tc := range contractCases() {
				t.Run(tc.name, func(t *testing.T) {
					p, err := balancer.NewPicker(policy)
					if err != nil {
						t.Fatal(err)
					}
					c := newFakeClock()
					cands := tc.setup(t, c)
					req := &balancer.Request{Now: t0.Add(tc.after)}
					if tc.zeroNow {
						req.Now = time.Time{}
					}
					// Enough picks to go round the candidates several times,
					// so every rotation offset is tried.
					got := countPicks(t, p, req, cands, 4*len(cands)+3, false)
					for name, n := range got {
						if name == "<nil>" {
							if len(tc.want) > 0 {
								t.Errorf("%d picks returned nil, want one of %v", n, tc.want)
							}
							continue
						}
						if !slices.Contains(tc.want, name) {
							t.Errorf("picked %s %d times, want only %v (all picks: %v)", name, n, tc.want, got)
						}
					}
				})
			}
		})
	}
}

// TestPickerOnlyCandidates gives every policy a candidate slice that is a
// busy subset of a larger set of idle replicas: a pick must come from the
// slice it was given, never from anything else it may have seen before.
func TestPickerOnlyCandidates(t *testing.T) {
	for _, policy := range balancer.Policies() {
		t.Run(policy, func(t *testing.T) {
			p, err := balancer.NewPicker(policy)
			if err != nil {
				t.Fatal(err)
			}
			c := newFakeClock()
			all := replicas(t, c, 8)
			req := &balancer.Request{Now: t0}
			// Warm the picker's state (rotation counters) on the full set.
			countPicks(t, p, req, all, 13, false)
			subset := []*balancer.Replica{
				newReplica(t, "busy0", c, replicaOpts{inFlight: 7}),
				newReplica(t, "busy1", c, replicaOpts{inFlight: 3}),
				newReplica(t, "busy2", c, replicaOpts{inFlight: 11}),
			}
			for i := range 50 {
				r := p.Pick(req, subset)
				if !slices.Contains(subset, r) {
					t.Fatalf("pick #%d returned %v, not a member of the candidates", i, r)
				}
			}
		})
	}
}

// TestRoundRobinEven checks that round_robin gives every available replica
// the same share, whatever sits between them, and visits all of them once
// per cycle.
func TestRoundRobinEven(t *testing.T) {
	tests := []struct {
		name  string
		state []replicaOpts // one replica per entry, named r0, r1, ...
		want  []string      // the available ones, each expecting an equal share
	}{
		{
			name:  "all available",
			state: []replicaOpts{{}, {}, {}, {}},
			want:  []string{"r0", "r1", "r2", "r3"},
		},
		{
			name:  "load does not matter",
			state: []replicaOpts{{inFlight: 9}, {}, {inFlight: 2}},
			want:  []string{"r0", "r1", "r2"},
		},
		{
			// The replica after a gap must not inherit the gap's turn.
			name:  "unavailable in the middle",
			state: []replicaOpts{{}, {down: true}, {}, {}},
			want:  []string{"r0", "r2", "r3"},
		},
		{
			name:  "runs of unavailable and an open breaker",
			state: []replicaOpts{{down: true}, {}, {open: true}, {down: true}, {}, {}, {down: true}},
			want:  []string{"r1", "r4", "r5"},
		},
		{
			name:  "one available",
			state: []replicaOpts{{down: true}, {open: true}, {}},
			want:  []string{"r2"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			var cands []*balancer.Replica
			for i, o := range tc.state {
				cands = append(cands, newReplica(t, fmt.Sprintf("r%d", i), c, o))
			}
			p, err := balancer.NewPicker("round_robin")
			if err != nil {
				t.Fatal(err)
			}
			req := &balancer.Request{Now: t0}
			const rounds = 50
			k := len(tc.want)
			var seq []string
			for range rounds * k {
				r := p.Pick(req, cands)
				if r == nil {
					t.Fatal("Pick returned nil with replicas available")
				}
				seq = append(seq, r.Name())
			}
			// Each window of k consecutive picks is one full cycle.
			for i := 0; i+k <= len(seq); i += k {
				w := slices.Clone(seq[i : i+k])
				sort.Strings(w)
				if !slices.Equal(w, tc.want) {
					t.Fatalf("picks %d..%d = %v, want one of each of %v", i, i+k-1, seq[i:i+k], tc.want)
				}
			}
		})
	}
}

// TestLeastRequestChoice checks which replica least_request picks from a
// fixed load, picking repeatedly without taking leases.
func TestLeastRequestChoice(t *testing.T) {
	tests := []struct {
		name  string
		state []replicaOpts
		picks int
		want  map[string]int // exact pick counts per replica name
	}{
		{
			name:  "lowest in-flight",
			state: []replicaOpts{{inFlight: 3}, {inFlight: 1}, {inFlight: 2}},
			picks: 30,
			want:  map[string]int{"r1": 30},
		},
		{
			// r0: (3+1)/4 = 1; r1: (1+1)/1 = 2.
			name:  "in-flight relative to weight",
			state: []replicaOpts{{weight: 4, inFlight: 3}, {weight: 1, inFlight: 1}},
			picks: 30,
			want:  map[string]int{"r0": 30},
		},
		{
			// Idle: (0+1)/2 beats (0+1)/1, so weight breaks what would be a tie.
			name:  "idle heavier replica first",
			state: []replicaOpts{{}, {weight: 2}, {}},
			picks: 30,
			want:  map[string]int{"r1": 30},
		},
		{
			name:  "equal replicas share picks",
			state: []replicaOpts{{}, {}, {}},
			picks: 300,
			want:  map[string]int{"r0": 100, "r1": 100, "r2": 100},
		},
		{
			name:  "ties share picks, busier excluded",
			state: []replicaOpts{{inFlight: 2}, {inFlight: 2}, {inFlight: 5}, {inFlight: 2}},
			picks: 300,
			want:  map[string]int{"r0": 100, "r1": 100, "r3": 100},
		},
		{
			// The tie after an unavailable replica must not get its turn too.
			name:  "ties share picks around unavailable",
			state: []replicaOpts{{}, {down: true}, {}, {open: true}, {}},
			picks: 300,
			want:  map[string]int{"r0": 100, "r2": 100, "r4": 100},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			var cands []*balancer.Replica
			for i, o := range tc.state {
				cands = append(cands, newReplica(t, fmt.Sprintf("r%d", i), c, o))
			}
			p, err := balancer.NewPicker("least_request")
			if err != nil {
				t.Fatal(err)
			}
			got := countPicks(t, p, &balancer.Request{Now: t0}, cands, tc.picks, false)
			if !mapsEqual(got, tc.want) {
				t.Errorf("picks = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLeastRequestConcurrentLoad builds up concurrent load the way the
// proxy does — each pick takes a lease that stays open — and checks that
// the load ends up proportional to weight.
func TestLeastRequestConcurrentLoad(t *testing.T) {
	tests := []struct {
		name    string
		weights []float64
		start   []int // in-flight before the first pick
		picks   int
		want    []int // in-flight per replica at the end, each ±1
	}{
		{name: "equal", weights: []float64{1, 1, 1}, start: []int{0, 0, 0}, picks: 300, want: []int{100, 100, 100}},
		{name: "weight 2 takes twice", weights: []float64{2, 1}, start: []int{0, 0}, picks: 300, want: []int{200, 100}},
		{name: "weights 1 2 4", weights: []float64{1, 2, 4}, start: []int{0, 0, 0}, picks: 700, want: []int{100, 200, 400}},
		{name: "fills the idle one first", weights: []float64{1, 1}, start: []int{50, 0}, picks: 150, want: []int{100, 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			var cands []*balancer.Replica
			for i, w := range tc.weights {
				cands = append(cands, newReplica(t, fmt.Sprintf("r%d", i), c, replicaOpts{weight: w, inFlight: tc.start[i]}))
			}
			p, err := balancer.NewPicker("least_request")
			if err != nil {
				t.Fatal(err)
			}
			countPicks(t, p, &balancer.Request{Now: t0}, cands, tc.picks, true)
			for i, r := range cands {
				if d := r.InFlight() - int64(tc.want[i]); d < -1 || d > 1 {
					t.Errorf("%s (weight %g) in flight %d, want %d±1", r.Name(), r.Weight(), r.InFlight(), tc.want[i])
				}
			}
		})
	}
}

func TestNewPicker(t *testing.T) {
	tests := []struct {
		name    string
		policy  string
		wantErr bool
	}{
		{name: "empty means least_request", policy: ""},
		{name: "unknown", policy: "random_walk", wantErr: true},
		{name: "case matters", policy: "Round_Robin", wantErr: true},
	}
	for _, p := range balancer.Policies() {
		tests = append(tests, struct {
			name    string
			policy  string
			wantErr bool
		}{name: "known " + p, policy: p})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := balancer.NewPicker(tc.policy)
			if (err != nil) != tc.wantErr {
				t.Fatalf("NewPicker(%q) error = %v, want error %v", tc.policy, err, tc.wantErr)
			}
			if !tc.wantErr && p == nil {
				t.Fatalf("NewPicker(%q) = nil picker", tc.policy)
			}
		})
	}
}

// --- Pool ---

func TestPoolPolicy(t *testing.T) {
	tests := []struct {
		name       string
		initial    string
		set        string
		wantErr    bool
		wantPolicy string
	}{
		{name: "default", initial: "", set: "", wantPolicy: balancer.DefaultPolicy},
		{name: "switch to round_robin", initial: "", set: "round_robin", wantPolicy: "round_robin"},
		{name: "switch back", initial: "round_robin", set: "least_request", wantPolicy: "least_request"},
		{name: "unknown keeps the old policy", initial: "round_robin", set: "nope", wantErr: true, wantPolicy: "round_robin"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: tc.initial}, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = pool.SetPolicy(tc.set)
			if (err != nil) != tc.wantErr {
				t.Fatalf("SetPolicy(%q) error = %v, want error %v", tc.set, err, tc.wantErr)
			}
			if got := pool.Policy(); got != tc.wantPolicy {
				t.Errorf("Policy() = %q, want %q", got, tc.wantPolicy)
			}
		})
	}
	t.Run("NewPool unknown policy", func(t *testing.T) {
		if _, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: "nope"}, nil); err == nil {
			t.Fatal("NewPool with an unknown policy succeeded")
		}
	})
}

// TestPoolCopyOnWrite: the pool keeps its own copy of the replica slice, so
// a caller reusing its slice can't change what requests in flight see.
func TestPoolCopyOnWrite(t *testing.T) {
	c := newFakeClock()
	a, b, x := newReplica(t, "a", c, replicaOpts{}), newReplica(t, "b", c, replicaOpts{}), newReplica(t, "x", c, replicaOpts{})
	tests := []struct {
		name string
		load func(p *balancer.Pool, rs []*balancer.Replica) *balancer.Pool
	}{
		{name: "NewPool", load: func(_ *balancer.Pool, rs []*balancer.Replica) *balancer.Pool {
			p, err := balancer.NewPool(balancer.PoolConfig{Model: "m"}, rs)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}},
		{name: "SetReplicas", load: func(p *balancer.Pool, rs []*balancer.Replica) *balancer.Pool {
			p.SetReplicas(rs)
			return p
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			empty, err := balancer.NewPool(balancer.PoolConfig{Model: "m"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			rs := []*balancer.Replica{a, b}
			pool := tc.load(empty, rs)
			before := pool.Replicas()
			rs[0], rs[1] = x, x
			if got := pool.Replicas(); !slices.Equal(got, []*balancer.Replica{a, b}) {
				t.Fatalf("Replicas() = %v after the caller mutated its slice, want [a b]", names(got))
			}
			if !slices.Equal(before, []*balancer.Replica{a, b}) {
				t.Fatalf("a slice returned earlier changed: %v", names(before))
			}
			for range 10 {
				if r := pool.Pick(&balancer.Request{Now: t0}); r == x {
					t.Fatal("picked a replica that was never given to the pool")
				}
			}
			// Replacing the set doesn't touch a slice handed out earlier.
			pool.SetReplicas([]*balancer.Replica{x})
			if !slices.Equal(before, []*balancer.Replica{a, b}) {
				t.Fatalf("SetReplicas changed a slice returned earlier: %v", names(before))
			}
			if got := pool.Replicas(); !slices.Equal(got, []*balancer.Replica{x}) {
				t.Fatalf("Replicas() = %v, want [x]", names(got))
			}
		})
	}
}

func TestPoolPickExcept(t *testing.T) {
	tests := []struct {
		name  string
		state []replicaOpts
		skip  []int // indexes into the pool's replicas
		extra bool  // also skip a replica that isn't in the pool
		want  []int // acceptable picks; empty means nil
	}{
		{name: "no skip", state: []replicaOpts{{}, {}, {}}, want: []int{0, 1, 2}},
		{name: "skip one", state: []replicaOpts{{}, {}, {}}, skip: []int{1}, want: []int{0, 2}},
		// least_request would prefer the idle skipped replica.
		{name: "skip the least loaded", state: []replicaOpts{{inFlight: 4}, {}, {inFlight: 4}}, skip: []int{1}, want: []int{0, 2}},
		{name: "skip all but one", state: []replicaOpts{{}, {}, {}}, skip: []int{0, 2}, want: []int{1}},
		{name: "skip all", state: []replicaOpts{{}, {}, {}}, skip: []int{0, 1, 2}},
		{name: "skip with rest unavailable", state: []replicaOpts{{}, {down: true}, {open: true}}, skip: []int{0}},
		{name: "skip unknown replica", state: []replicaOpts{{}, {}}, extra: true, want: []int{0, 1}},
	}
	for _, policy := range balancer.Policies() {
		for _, tc := range tests {
			t.Run(policy+"/"+tc.name, func(t *testing.T) {
				c := newFakeClock()
				var rs []*balancer.Replica
				for i, o := range tc.state {
					rs = append(rs, newReplica(t, fmt.Sprintf("r%d", i), c, o))
				}
				pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m", Policy: policy}, rs)
				if err != nil {
					t.Fatal(err)
				}
				var skip []*balancer.Replica
				for _, i := range tc.skip {
					skip = append(skip, rs[i])
				}
				if tc.extra {
					skip = append(skip, newReplica(t, "stranger", c, replicaOpts{}))
				}
				var want []*balancer.Replica
				for _, i := range tc.want {
					want = append(want, rs[i])
				}
				req := &balancer.Request{Now: t0}
				for i := range 4*len(rs) + 3 {
					r := pool.PickExcept(req, skip)
					switch {
					case len(want) == 0 && r != nil:
						t.Fatalf("pick #%d = %s, want nil", i, r.Name())
					case len(want) > 0 && !slices.Contains(want, r):
						t.Fatalf("pick #%d = %v, want one of %v", i, r, names(want))
					}
				}
			})
		}
	}
}

func TestPoolAvailable(t *testing.T) {
	tests := []struct {
		name  string
		state []replicaOpts
		after time.Duration
		want  int
	}{
		{name: "empty", want: 0},
		{name: "all up", state: []replicaOpts{{}, {inFlight: 3}, {}}, want: 3},
		{name: "unhealthy and open excluded", state: []replicaOpts{{}, {down: true}, {open: true}, {}}, want: 2},
		{name: "open past its timeout counts", state: []replicaOpts{{}, {down: true}, {open: true}}, after: testBreaker.OpenTimeout, want: 2},
		{name: "unhealthy and open past timeout still excluded", state: []replicaOpts{{down: true, open: true}}, after: 2 * testBreaker.OpenTimeout, want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			var rs []*balancer.Replica
			for i, o := range tc.state {
				rs = append(rs, newReplica(t, fmt.Sprintf("r%d", i), c, o))
			}
			pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m"}, rs)
			if err != nil {
				t.Fatal(err)
			}
			if got := pool.Available(t0.Add(tc.after)); got != tc.want {
				t.Errorf("Available = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestPoolConcurrent exercises the lock-free paths together under -race:
// picks with leases on several goroutines while the replica set and the
// policy are swapped. Bounded by iteration counts, not by time.
func TestPoolConcurrent(t *testing.T) {
	c := newFakeClock()
	setA := replicas(t, c, 4)
	setB := append(replicas(t, c, 3), newReplica(t, "down", c, replicaOpts{down: true}))
	pool, err := balancer.NewPool(balancer.PoolConfig{Model: "m"}, setA)
	if err != nil {
		t.Fatal(err)
	}
	const workers, iters = 4, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			req := &balancer.Request{Now: t0}
			for i := range iters {
				var r *balancer.Replica
				if i%5 == 0 {
					r = pool.PickExcept(req, pool.Replicas()[:1])
				} else {
					r = pool.Pick(req)
				}
				if r == nil {
					continue // a swap may have left only excluded replicas
				}
				l, err := r.Acquire()
				if err != nil {
					t.Errorf("worker %d: Acquire(%s): %v", w, r.Name(), err)
					return
				}
				l.Done(nil)
			}
		})
	}
	wg.Go(func() {
		for i := range iters {
			if i%2 == 0 {
				pool.SetReplicas(setA)
			} else {
				pool.SetReplicas(setB)
			}
			if err := pool.SetPolicy(balancer.Policies()[i%len(balancer.Policies())]); err != nil {
				t.Error(err)
				return
			}
			_ = pool.Available(t0)
		}
	})
	wg.Wait()
	for _, r := range append(setA, setB...) {
		if n := r.InFlight(); n != 0 {
			t.Errorf("%s in flight %d after every lease ended, want 0", r.Name(), n)
		}
	}
}

func names(rs []*balancer.Replica) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name()
	}
	return out
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
