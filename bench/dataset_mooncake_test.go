package bench

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseMooncake(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []MooncakeRow
		wantErr string
	}{
		{
			name: "release form",
			in:   `{"timestamp": 0, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}` + "\n" + `{"timestamp": 40, "input_length": 10, "output_length": 3, "hash_ids": [0]}` + "\n",
			want: []MooncakeRow{{0, 600, 6, []uint64{0, 1}, 1}, {40 * time.Millisecond, 10, 3, []uint64{0}, 2}},
		},
		{
			name: "unsorted, not from 0, fractional ms, blank lines, other fields",
			in:   "\n" + `{"timestamp": 1000.5, "input_length": 1, "output_length": 1, "hash_ids": [7], "x": 1}` + "\n\n" + `{"hash_ids": [], "output_length": 2, "input_length": 0, "timestamp": 1000}`,
			want: []MooncakeRow{{0, 0, 2, []uint64{}, 4}, {500 * time.Microsecond, 1, 1, []uint64{7}, 2}},
		},
		{name: "empty", in: "", want: nil},
		{name: "not json", in: `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}` + "\nnope\n", wantErr: "line 2"},
		{name: "missing hash_ids", in: `{"timestamp": 0, "input_length": 1, "output_length": 1}`, wantErr: "line 1: want timestamp"},
		{name: "negative length", in: `{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}`, wantErr: "line 1: negative"},
		{name: "negative timestamp", in: `{"timestamp": -5, "input_length": 1, "output_length": 1, "hash_ids": []}`, wantErr: "line 1: timestamp"},
		{name: "negative id", in: `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-1]}`, wantErr: "line 1"},
		{name: "two values", in: `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []} {}`, wantErr: "more than one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := ParseMooncake(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, ErrDataset) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != len(tt.want) {
				t.Fatalf("rows = %+v, want %+v", rows, tt.want)
			}
			for i, r := range rows {
				w := tt.want[i]
				if r.Offset != w.Offset || r.InputLength != w.InputLength || r.OutputLength != w.OutputLength || r.Line != w.Line || !slices.Equal(r.HashIDs, w.HashIDs) {
					t.Fatalf("row %d = %+v, want %+v", i, r, w)
				}
			}
		})
	}
}

func TestMooncakeDataset(t *testing.T) {
	est := newEstimator(t)
	tests := []struct {
		name        string
		n, maxLen   int
		scale       float64
		wantLens    []int // prompt tokens of the requests kept
		wantDropped int
		wantLast    time.Duration
	}{
		{"whole file", 0, 0, 0, []int{1500, 1100, 2000, 300}, 0, 3000500 * time.Microsecond},
		{"first 2, twice as fast", 2, 0, 2, []int{1500, 1100}, 0, 625 * time.Millisecond},
		{"max model len drops what vLLM refuses", 0, 1502, 1, []int{1500, 1100, 300}, 1, 3000500 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := LoadDataset(DatasetConfig{Name: DatasetMooncake, Path: "testdata/mooncake_small.jsonl", NumPrompts: tt.n,
				TimeScale: tt.scale, MaxModelLen: tt.maxLen, Estimator: est})
			if err != nil {
				t.Fatal(err)
			}
			var lens []int
			for _, r := range d.Requests {
				lens = append(lens, r.PromptTokens)
			}
			if !d.Timed || !slices.Equal(lens, tt.wantLens) || d.Dropped != tt.wantDropped {
				t.Fatalf("timed %v, prompts %v, dropped %d; want %v, %d", d.Timed, lens, d.Dropped, tt.wantLens, tt.wantDropped)
			}
			if last := d.Requests[len(d.Requests)-1]; last.Arrival != tt.wantLast || last.OutputTokens < 1 {
				t.Fatalf("last request %+v, want arrival %v", last, tt.wantLast)
			}
		})
	}
}

// Prompts are exactly input_length tokens; requests that share hash-id
// prefixes share exactly that prefix, token for token.
func TestMooncakePromptsShareTheirBlocks(t *testing.T) {
	est := newEstimator(t)
	d, err := LoadDataset(DatasetConfig{Name: DatasetMooncake, Path: "testdata/mooncake_small.jsonl", Estimator: est})
	if err != nil {
		t.Fatal(err)
	}
	toks := make([][]uint, len(d.Requests))
	for i, r := range d.Requests {
		p := blockPrompt(est, r.PromptBlocks, r.PromptTokens, r.PromptSeed)
		if toks[i] = est.Encode(p); len(toks[i]) != r.PromptTokens {
			t.Fatalf("request %d: %d tokens, want %d", i, len(toks[i]), r.PromptTokens)
		}
	}
	common := func(a, b []uint) int {
		n := 0
		for n < min(len(a), len(b)) && a[n] == b[n] {
			n++
		}
		return n
	}
	tests := []struct {
		name string
		a, b int
		want int
	}{
		{"[1 2 3] and [1 2 4]: two blocks", 0, 1, 1024},
		{"[1 2 3] cut and [1 2 3 5]: all of the shorter", 0, 2, 1500},
		{"[1 2 4] and [1 2 3 5]: two blocks", 1, 2, 1024},
		{"[1 2 3] and [9]: nothing", 0, 3, 0},
	}
	for _, tt := range tests {
		if got := common(toks[tt.a], toks[tt.b]); got != tt.want {
			t.Errorf("%s: %d tokens in common, want %d", tt.name, got, tt.want)
		}
	}
	if r, ok := d.IdealPrefixHitRate(); !ok || r != 5.0/11 {
		t.Errorf("ideal prefix hit rate %v (%v), want 5/11: blocks 1, 2 twice and 3 once seen before", r, ok)
	}
	// Any ids, any cut: two prompts share their common ids' blocks and part
	// ways within one 16-token KV block after them.
	for seed := range uint64(40) {
		rng := newRand(seed)
		ids := func(shared []uint64) []uint64 {
			out := slices.Clone(shared)
			for range 1 + rng.IntN(3) {
				out = append(out, 1000+rng.Uint64N(1<<40))
			}
			return out
		}
		shared := []uint64{rng.Uint64N(1 << 20), rng.Uint64N(1 << 20)}[:rng.IntN(3)]
		a, b := ids(shared), ids(shared)
		pa := est.Encode(blockPrompt(est, a, len(a)*512, 1))
		pb := est.Encode(blockPrompt(est, b, len(b)*512-rng.IntN(400), 2))
		if c := common(pa, pb); c < len(shared)*512 || c >= len(shared)*512+11 {
			t.Fatalf("%v and %v: %d tokens in common, want %d (+ under 11)", a, b, c, len(shared)*512)
		}
	}
}

// The simulator's prefix cache hits on exactly the blocks two prompts
// share, through /v1/completions (the prompt is the text as is; a chat
// template would put its own tokens around it).
func TestMooncakePromptsHitSimPrefixCache(t *testing.T) {
	est := newEstimator(t)
	f, model := simFleet(t, est, 10)
	d, err := LoadDataset(DatasetConfig{Name: DatasetMooncake, Path: "testdata/mooncake_small.jsonl", Estimator: est})
	if err != nil {
		t.Fatal(err)
	}
	for i := range d.Requests {
		d.Requests[i].Arrival = 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Run(ctx, Config{BaseURL: f.URLs()[0], Model: model, Requests: d.Requests, MaxConcurrency: 1, IgnoreEOS: true, Estimator: est})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Records {
		if !r.OK() {
			t.Fatalf("request %d failed: %s", r.Index, r.Error)
		}
	}
	snap, err := (&Scraper{}).Scrape(ctx, f.URLs()[0]+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	hits, _ := snap.sum(metricPrefixHits)
	queries, _ := snap.sum(metricPrefixQueries)
	// One at a time: [1 2 4] finds [1 2] (1024 tokens); [1 2 3 5] finds
	// the full 16-token blocks of [1 2 3]'s 1500 tokens (1488); [9] none.
	if hits != 1024+1488 || queries != 1500+1100+2000+300 {
		t.Fatalf("prefix cache hits %v of %v queried tokens, want 2512 of 4900", hits, queries)
	}
}

// The shared trace is outside the module; skip when it is absent.
func TestParseMooncakeSyntheticFile(t *testing.T) {
	const path = "../../shared/data/mooncake-synthetic.jsonl"
	if _, err := os.Stat(path); err != nil {
		t.Skipf("no shared trace: %v", err)
	}
	d, err := LoadDataset(DatasetConfig{Name: DatasetMooncake, Path: path, MaxModelLen: 131072, Estimator: newEstimator(t)})
	if err != nil {
		t.Fatal(err)
	}
	var in float64
	for _, r := range d.Requests {
		in += float64(r.PromptTokens)
	}
	in /= float64(len(d.Requests))
	ideal, _ := d.IdealPrefixHitRate()
	// data/README.md: 3,993 requests, mean prompt 15,325, about 64% of
	// blocks repeat; 10 are longer than 131072 with their output.
	if len(d.Requests)+d.Dropped != 3993 || d.Dropped != 10 || in < 14000 || in > 15325 || ideal < 0.6 || ideal > 0.68 {
		t.Fatalf("%d requests + %d dropped, mean prompt %.0f, ideal hit rate %.3f", len(d.Requests), d.Dropped, in, ideal)
	}
}
