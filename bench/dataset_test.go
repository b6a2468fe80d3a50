package bench

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/tokens"
)

func newEstimator(t testing.TB) *tokens.Estimator {
	t.Helper()
	e, err := tokens.New()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestRandomDatasetLengths(t *testing.T) {
	est := newEstimator(t)
	tests := []struct {
		name          string
		in, out       int
		ratio         float64
		inLo, inHi    int
		outLo, outHi  int
		wantSpreadOut bool
	}{
		{"defaults exact", 0, 0, 0, 1024, 1024, 128, 128, false},
		{"ratio 0.5", 100, 10, 0.5, 50, 150, 5, 15, true},
		{"ratio keeps output at least 1", 10, 1, 0.9, 1, 19, 1, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DatasetConfig{Name: DatasetRandom, NumPrompts: 500, Seed: 7, RandomInputLen: tt.in, RandomOutputLen: tt.out, RandomRangeRatio: tt.ratio, Estimator: est}
			d, err := LoadDataset(c)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Requests) != 500 || d.Timed {
				t.Fatalf("got %d requests, timed=%v", len(d.Requests), d.Timed)
			}
			seenIn := map[int]bool{}
			for _, r := range d.Requests {
				if r.PromptTokens < tt.inLo || r.PromptTokens > tt.inHi || r.OutputTokens < tt.outLo || r.OutputTokens > tt.outHi {
					t.Fatalf("lengths %d/%d outside [%d,%d]/[%d,%d]", r.PromptTokens, r.OutputTokens, tt.inLo, tt.inHi, tt.outLo, tt.outHi)
				}
				seenIn[r.PromptTokens] = true
			}
			if tt.wantSpreadOut && len(seenIn) < 5 {
				t.Fatalf("only %d distinct input lengths", len(seenIn))
			}
			again, _ := LoadDataset(c)
			for i := range d.Requests {
				if !reflect.DeepEqual(d.Requests[i], again.Requests[i]) {
					t.Fatalf("request %d differs between runs with the same seed", i)
				}
			}
		})
	}
}

// The long-context row's lengths: prompts 8k-32k and outputs 100-800 need
// a ratio each (0.6 around 20000, 0.7777 around 450).
func TestRandomOutputRangeRatio(t *testing.T) {
	d, err := LoadDataset(DatasetConfig{Name: DatasetRandom, NumPrompts: 2000, Seed: 1, RandomInputLen: 20000, RandomOutputLen: 450,
		RandomRangeRatio: 0.6, RandomOutputRangeRatio: 0.7777, Estimator: newEstimator(t)})
	if err != nil {
		t.Fatal(err)
	}
	inLo, inHi, outLo, outHi := 1<<30, 0, 1<<30, 0
	for _, r := range d.Requests {
		inLo, inHi = min(inLo, r.PromptTokens), max(inHi, r.PromptTokens)
		outLo, outHi = min(outLo, r.OutputTokens), max(outHi, r.OutputTokens)
	}
	if inLo < 8000 || inHi > 32000 || inLo > 8100 || inHi < 31900 {
		t.Errorf("prompts span %d-%d, want 8000-32000", inLo, inHi)
	}
	if outLo < 100 || outHi > 800 || outLo > 105 || outHi < 795 {
		t.Errorf("outputs span %d-%d, want 100-800", outLo, outHi)
	}
}

func TestDatasetConfigValidate(t *testing.T) {
	est := newEstimator(t)
	tests := []struct {
		name string
		c    DatasetConfig
		want string
	}{
		{"unknown name", DatasetConfig{Name: "nope", Estimator: est}, "unknown dataset"},
		{"ratio 1", DatasetConfig{Name: DatasetRandom, RandomRangeRatio: 1, Estimator: est}, "range ratio"},
		{"output ratio 1", DatasetConfig{Name: DatasetRandom, RandomOutputRangeRatio: 1, Estimator: est}, "range ratio"},
		{"mooncake without path", DatasetConfig{Name: DatasetMooncake, Estimator: est}, "needs a dataset path"},
		{"negative max model len", DatasetConfig{Name: DatasetRandom, MaxModelLen: -1, Estimator: est}, "max model len"},
		{"file dataset without path", DatasetConfig{Name: DatasetShareGPT, Estimator: est}, "needs a dataset path"},
		{"negative time scale", DatasetConfig{Name: DatasetAzureTrace, Path: "x", TimeScale: -1, Estimator: est}, "time scale"},
		{"no estimator", DatasetConfig{Name: DatasetRandom}, "estimator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Validate()
			if err == nil || !errors.Is(err, ErrDataset) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want ErrDataset mentioning %q", err, tt.want)
			}
		})
	}
}

func TestUseCaseDatasetMix(t *testing.T) {
	d, err := LoadDataset(DatasetConfig{Name: DatasetUseCase, NumPrompts: 2000, Seed: 3, Estimator: newEstimator(t)})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for _, uc := range UseCases() {
		want[uc.Name] = uc.OutputTokens
	}
	count := map[string]int{}
	for _, r := range d.Requests {
		out, ok := want[r.UseCase]
		if !ok {
			t.Fatalf("unknown use case %q", r.UseCase)
		}
		if r.OutputTokens != out {
			t.Fatalf("%s: output %d, want %d (ratio 0)", r.UseCase, r.OutputTokens, out)
		}
		count[r.UseCase]++
	}
	for name := range want {
		// Equal weights: 400 expected each; 5 sigma ≈ ±90.
		if c := count[name]; c < 310 || c > 490 {
			t.Errorf("%s drawn %d times of 2000, want ≈400", name, c)
		}
	}
}

func TestShareGPTSyntheticMeans(t *testing.T) {
	d, err := LoadDataset(DatasetConfig{Name: DatasetShareGPTSynthetic, NumPrompts: 5000, Seed: 1, Estimator: newEstimator(t)})
	if err != nil {
		t.Fatal(err)
	}
	var in, out float64
	for _, r := range d.Requests {
		if !validShareGPTLens(r.PromptTokens, r.OutputTokens) {
			t.Fatalf("lengths %d/%d fail vllm's filter", r.PromptTokens, r.OutputTokens)
		}
		in += float64(r.PromptTokens)
		out += float64(r.OutputTokens)
	}
	in /= float64(len(d.Requests))
	out /= float64(len(d.Requests))
	if in < 200 || in > 260 || out < 170 || out > 235 {
		t.Fatalf("mean lengths %.0f in / %.0f out, want ≈230 / ≈200", in, out)
	}
}

func TestParseShareGPT(t *testing.T) {
	tests := []struct {
		name      string
		file      string
		wantPairs int
		wantErr   string
	}{
		{"small", "sharegpt_small.json", 3, ""},
		{"malformed record", "sharegpt_malformed.json", 0, "record 1"},
		{"not an array", "custom_small.jsonl", 0, "JSON array"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			pairs, err := ParseShareGPT(f)
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, ErrDataset) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(pairs) != tt.wantPairs {
				t.Fatalf("%d pairs, want %d: %+v", len(pairs), tt.wantPairs, pairs)
			}
			if !strings.HasPrefix(pairs[1].Prompt, "Name three primes") && !strings.HasPrefix(pairs[1].Prompt, "Name three prime") {
				t.Fatalf("system turn not skipped: %q", pairs[1].Prompt)
			}
		})
	}
}

func TestShareGPTDatasetFiltersAndOversamples(t *testing.T) {
	est := newEstimator(t)
	d, err := LoadDataset(DatasetConfig{Name: DatasetShareGPT, Path: "testdata/sharegpt_small.json", NumPrompts: 6, Seed: 2, Estimator: est})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Requests) != 6 {
		t.Fatalf("%d requests, want 6 (oversampled)", len(d.Requests))
	}
	for _, r := range d.Requests {
		if r.Prompt == "Hi" {
			t.Fatal("a 1-token prompt passed the filter")
		}
		if r.PromptTokens != est.Count(r.Prompt) || r.OutputTokens < 4 {
			t.Fatalf("bad lengths %+v", r)
		}
	}
	d, err = LoadDataset(DatasetConfig{Name: DatasetShareGPT, Path: "testdata/sharegpt_small.json", NumPrompts: 2, ShareGPTOutputLen: 77, Estimator: est})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range d.Requests {
		if r.OutputTokens != 77 {
			t.Fatalf("output %d, want the override 77", r.OutputTokens)
		}
	}
}

func TestParseTrace(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []TraceRow
		wantErr string
	}{
		{
			name: "azure 2023 form",
			in:   "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\r\n2023-11-16 18:15:50.9951690,396,109\n",
			want: []TraceRow{{0, 374, 44, 2}, {4314579000, 396, 109, 3}},
		},
		{
			name: "azure 2024 form with zone and no fraction",
			in:   "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,10,20\n2024-05-10 00:00:01+00:00,11,21\n",
			want: []TraceRow{{0, 10, 20, 2}, {990070000, 11, 21, 3}},
		},
		{
			name: "guidellm names, numeric seconds, other order, unsorted",
			in:   "input_length,output_length,timestamp\n5,6,10.5\n7,8,10.25\n",
			want: []TraceRow{{0, 7, 8, 3}, {250 * time.Millisecond, 5, 6, 2}},
		},
		{name: "empty", in: "", wantErr: "empty file"},
		{name: "header only", in: "TIMESTAMP,ContextTokens,GeneratedTokens\n", want: nil},
		{name: "missing column", in: "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n", wantErr: "line 1"},
		{name: "bad timestamp", in: "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,2\n2023-13-16 18:15:46,1,2\n", wantErr: "line 3: timestamp"},
		{name: "field count", in: "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1\n", wantErr: "line 2: 2 fields"},
		{name: "negative tokens", in: "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-1,2\n", wantErr: "line 2: input length"},
		{name: "not a number", in: "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,x\n", wantErr: "line 2: output length"},
		{name: "mixed kinds", in: "timestamp,input_length,output_length\n1.5,1,1\n2023-11-16 18:15:46,1,1\n", wantErr: "line 3: mixes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := ParseTrace(strings.NewReader(tt.in))
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
			for i := range rows {
				if rows[i] != tt.want[i] {
					t.Fatalf("row %d = %+v, want %+v", i, rows[i], tt.want[i])
				}
			}
		})
	}
}

func TestTraceDatasetTimeScale(t *testing.T) {
	est := newEstimator(t)
	tests := []struct {
		name    string
		scale   float64
		n       int
		wantLen int
		want1   time.Duration
	}{
		{"real time", 0, 0, 4, 4314579000},
		{"twice as fast", 2, 0, 4, 4314579000 / 2},
		{"half speed, first 2", 0.5, 2, 2, 2 * 4314579000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := LoadDataset(DatasetConfig{Name: DatasetAzureTrace, Path: "testdata/trace_small.csv", TimeScale: tt.scale, NumPrompts: tt.n, Estimator: est})
			if err != nil {
				t.Fatal(err)
			}
			if !d.Timed || len(d.Requests) != tt.wantLen {
				t.Fatalf("timed=%v len=%d", d.Timed, len(d.Requests))
			}
			if d.Requests[0].Arrival != 0 || d.Requests[1].Arrival != tt.want1 {
				t.Fatalf("arrivals %v, %v; want 0, %v", d.Requests[0].Arrival, d.Requests[1].Arrival, tt.want1)
			}
			if r := d.Requests[1]; r.PromptTokens != 396 || r.OutputTokens != 109 || r.Prompt != "" {
				t.Fatalf("request 1 = %+v", r)
			}
		})
	}
	_, err := LoadDataset(DatasetConfig{Name: DatasetAzureTrace, Path: "testdata/trace_malformed.csv", Estimator: est})
	if err == nil || !strings.Contains(err.Error(), "line 4") || !strings.Contains(err.Error(), "trace_malformed.csv") {
		t.Fatalf("err = %v, want one naming the file and line 4", err)
	}
}

// The real trace is shared data outside the module; skip when it is absent.
func TestParseAzureTraceFile(t *testing.T) {
	const path = "../../shared/data/azure-llm-2023-conv.csv"
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("no real trace: %v", err)
	}
	defer f.Close()
	rows, err := ParseTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 19366 {
		t.Fatalf("%d rows, want 19366 (data/README.md)", len(rows))
	}
	var in, out float64
	for _, r := range rows {
		in += float64(r.ContextTokens)
		out += float64(r.GeneratedTokens)
	}
	in /= float64(len(rows))
	out /= float64(len(rows))
	span := rows[len(rows)-1].Offset
	rate := float64(len(rows)) / span.Seconds()
	// README: one hour, ≈5.5 req/s, mean context 1,155, mean generated 211.
	if span < 55*time.Minute || span > 61*time.Minute || rate < 5 || rate > 6 || in < 1100 || in > 1200 || out < 200 || out > 220 {
		t.Fatalf("span %v, rate %.2f/s, mean in %.0f, mean out %.0f", span, rate, in, out)
	}
}

func TestParseCustom(t *testing.T) {
	est := newEstimator(t)
	d, err := LoadDataset(DatasetConfig{Name: DatasetCustom, Path: "testdata/custom_small.jsonl", NumPrompts: 3, Estimator: est})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Requests) != 3 {
		t.Fatalf("%d requests", len(d.Requests))
	}
	if r := d.Requests[0]; r.OutputTokens != 32 || r.UseCase != "poetry" || r.PromptTokens != est.Count(r.Prompt) {
		t.Fatalf("request 0 = %+v", r)
	}
	if r := d.Requests[1]; r.OutputTokens != 256 {
		t.Fatalf("request 1 output %d, want the default 256", r.OutputTokens)
	}
	tests := []struct {
		name, in, want string
	}{
		{"wrong type", "{\"prompt\":\"a\"}\n{\"prompt\":\"b\",\"output_tokens\":\"x\"}\n", "line 2"},
		{"missing prompt", "\n\n{\"output_tokens\":3}\n", "line 3: empty or missing prompt"},
		{"unknown field", "{\"prompt\":\"a\",\"max_tokens\":3}\n", "line 1"},
		{"negative", "{\"prompt\":\"a\",\"output_tokens\":-3}\n", "line 1: output_tokens"},
		{"two values", "{\"prompt\":\"a\"} {\"prompt\":\"b\"}\n", "line 1: more than one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCustom(strings.NewReader(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	_, err = LoadDataset(DatasetConfig{Name: DatasetCustom, Path: "testdata/custom_malformed.jsonl", Estimator: est})
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("err = %v, want line 2", err)
	}
}
