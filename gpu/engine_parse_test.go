package gpu

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestParseEngineMetricsGolden(t *testing.T) {
	t.Parallel()
	all := FieldRunning | FieldWaiting | FieldKVUsage | FieldKVCapacity | FieldPrefixCache | FieldPreemptions
	for _, tc := range []struct {
		name, file string
		want       EngineStats
		wantErr    error
	}{
		{name: "v1 names, one engine", file: "vllm_v1.txt", want: EngineStats{Running: 8, Waiting: 2, KVUsage: 0.4127,
			KVCapacityTokens: 27000 * 16, PrefixCacheQueries: 250000, PrefixCacheHits: 225000, PrefixCacheHitRate: 0.9,
			PreemptionsTotal: 3, Engines: 1, Reported: all}},
		{name: "v0.10 exposes both KV names: the new one wins", file: "vllm_v010.txt", want: EngineStats{Running: 5,
			KVUsage: 0.25, KVCapacityTokens: 12000 * 16, PrefixCacheQueries: 1000, PrefixCacheHits: 400,
			PrefixCacheHitRate: 0.4, Engines: 1, Reported: all}},
		{name: "old gpu_cache_usage_perc and gpu_prefix_cache names, no engine label", file: "vllm_old.txt",
			want: EngineStats{Running: 3, Waiting: 7, KVUsage: 0.91, KVCapacityTokens: 8192 * 32,
				PrefixCacheQueries: 80000, PrefixCacheHits: 20000, PrefixCacheHitRate: 0.25, PreemptionsTotal: 12,
				Engines: 1, Reported: all}},
		{name: "three data-parallel engines: sums and a mean", file: "vllm_dp.txt", want: EngineStats{Running: 22,
			Waiting: 5, KVUsage: 0.5, KVCapacityTokens: 3 * 5000 * 16, PrefixCacheQueries: 400, PrefixCacheHits: 200,
			PrefixCacheHitRate: 0.5, PreemptionsTotal: 3, Engines: 3, Reported: all}},
		{name: "missing families are reported as missing", file: "vllm_partial.txt",
			want: EngineStats{Running: 4, Waiting: 1, Engines: 1, Reported: FieldRunning | FieldWaiting}},
		{name: "garbage", file: "garbage.txt", wantErr: ErrNoEngineMetrics},
		{name: "malformed line of a needed family", file: "vllm_malformed.txt", wantErr: ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseEngineMetrics(readTestdata(t, tc.file))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			w := tc.want
			if got.Running != w.Running || got.Waiting != w.Waiting || !near(got.KVUsage, w.KVUsage) ||
				got.KVCapacityTokens != w.KVCapacityTokens || !near(got.PrefixCacheQueries, w.PrefixCacheQueries) ||
				!near(got.PrefixCacheHits, w.PrefixCacheHits) || !near(got.PrefixCacheHitRate, w.PrefixCacheHitRate) ||
				got.PreemptionsTotal != w.PreemptionsTotal || got.Preemptions != 0 || got.Engines != w.Engines ||
				got.Reported != w.Reported || !got.At.IsZero() {
				t.Errorf("got  %+v\nwant %+v", *got, w)
			}
		})
	}
}

// The goldens must be valid expositions as a whole (so that they test our
// filter, not a broken file), except the two that are broken on purpose.
func TestGoldensAreValidExpositions(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("testdata/*.txt")
	if len(files) < 6 {
		t.Fatalf("only %d goldens", len(files))
	}
	for _, f := range files {
		base := filepath.Base(f)
		if base == "garbage.txt" || base == "vllm_malformed.txt" {
			continue
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		if _, err := p.TextToMetricFamilies(bytes.NewReader(readTestdata(t, base))); err != nil {
			t.Errorf("%s: %v", base, err)
		}
	}
}

func TestParseEngineMetricsEdgeCases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text string
		check      func(t *testing.T, s *EngineStats, err error)
	}{
		{"empty body", "", func(t *testing.T, s *EngineStats, err error) {
			if !errors.Is(err, ErrNoEngineMetrics) {
				t.Errorf("err = %v", err)
			}
		}},
		{"no trailing newline, CRLF, NaN and out-of-range values", "vllm:num_requests_running{engine=\"0\"} 2\r\n" +
			"vllm:num_requests_running{engine=\"1\"} NaN\r\nvllm:kv_cache_usage_perc{engine=\"0\"} 1.5\r\n" +
			"vllm:num_requests_waiting -3", func(t *testing.T, s *EngineStats, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if s.Running != 2 || s.Engines != 1 || s.KVUsage != 1 || s.Waiting != 0 {
				t.Errorf("%+v", *s)
			}
		}},
		{"_created and lookalike names are not read", "vllm:num_preemptions_created 1.7e9\n" +
			"vllm:num_requests_running_x 9\nvllm:num_requests_waiting 1\n", func(t *testing.T, s *EngineStats, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if s.Reported != FieldWaiting || s.PreemptionsTotal != 0 || s.Running != 0 {
				t.Errorf("%+v", *s)
			}
		}},
		{"cache_config_info before profiling", `vllm:kv_cache_usage_perc 0.1` + "\n" +
			`vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1` + "\n",
			func(t *testing.T, s *EngineStats, err error) {
				if err != nil || s.Reported.Has(FieldKVCapacity) || s.KVCapacityTokens != 0 {
					t.Errorf("%v %+v", err, s)
				}
			}},
		{"hits without queries are not a prefix-cache report", "vllm:num_requests_running 1\nvllm:prefix_cache_hits_total 5\n",
			func(t *testing.T, s *EngineStats, err error) {
				if err != nil || s.Reported.Has(FieldPrefixCache) {
					t.Errorf("%v %+v", err, s)
				}
			}},
		{"leading blanks and comments", "  # HELP x\n\t\nvllm:num_requests_running 3\n", func(t *testing.T, s *EngineStats, err error) {
			if err != nil || s.Running != 3 {
				t.Errorf("%v %+v", err, s)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := ParseEngineMetrics([]byte(tc.text))
			tc.check(t, s, err)
		})
	}
}

func TestEngineStatsSince(t *testing.T) {
	t.Parallel()
	both := FieldPrefixCache | FieldPreemptions
	at := time.Unix(100, 0)
	for _, tc := range []struct {
		name            string
		prev, cur       *EngineStats
		wantRate        float64
		wantPreemptions uint64
	}{
		{"first scrape keeps the lifetime ratio, no preemption delta", nil,
			&EngineStats{Reported: both, PrefixCacheQueries: 100, PrefixCacheHits: 50, PrefixCacheHitRate: 0.5, PreemptionsTotal: 7},
			0.5, 0},
		{"rate over the interval",
			&EngineStats{Reported: both, PrefixCacheQueries: 100, PrefixCacheHits: 50, PreemptionsTotal: 7},
			&EngineStats{Reported: both, PrefixCacheQueries: 200, PrefixCacheHits: 140, PrefixCacheHitRate: 0.7, PreemptionsTotal: 9},
			0.9, 2},
		{"no queries in the interval keeps the previous rate",
			&EngineStats{Reported: both, PrefixCacheQueries: 100, PrefixCacheHits: 50, PrefixCacheHitRate: 0.8},
			&EngineStats{Reported: both, PrefixCacheQueries: 100, PrefixCacheHits: 50, PrefixCacheHitRate: 0.5},
			0.8, 0},
		{"counter reset (engine restart) falls back to lifetime",
			&EngineStats{Reported: both, PrefixCacheQueries: 1000, PrefixCacheHits: 900, PreemptionsTotal: 50},
			&EngineStats{Reported: both, PrefixCacheQueries: 10, PrefixCacheHits: 1, PrefixCacheHitRate: 0.1, PreemptionsTotal: 2},
			0.1, 0},
		{"previous lacked the counters",
			&EngineStats{},
			&EngineStats{Reported: both, PrefixCacheQueries: 10, PrefixCacheHits: 5, PrefixCacheHitRate: 0.5, PreemptionsTotal: 2},
			0.5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cur.since(tc.prev)
			if !near(tc.cur.PrefixCacheHitRate, tc.wantRate) || tc.cur.Preemptions != tc.wantPreemptions {
				t.Errorf("rate %v preemptions %d, want %v %d", tc.cur.PrefixCacheHitRate, tc.cur.Preemptions, tc.wantRate, tc.wantPreemptions)
			}
		})
	}
	var nilStats *EngineStats
	if nilStats.Age(at) != maxDuration || (&EngineStats{}).Age(at) != maxDuration {
		t.Error("a nil or unpublished snapshot must be infinitely old")
	}
	if got := (&EngineStats{At: at}).Age(at.Add(time.Second)); got != time.Second {
		t.Errorf("Age = %v", got)
	}
}

func FuzzParseEngineMetrics(f *testing.F) {
	// Small seeds: the goldens (50–110 KB) make the fuzzer spend its time
	// minimising; these cover the same line shapes.
	for _, name := range []string{"vllm_partial.txt", "vllm_malformed.txt", "garbage.txt"} {
		f.Add(readTestdata(f, name))
	}
	f.Add([]byte(`vllm:num_requests_running{engine="0",model_name="m"} 8.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.41
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="27000"} 1.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 250000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 225000.0
vllm:gpu_prefix_cache_hits_total{model_name="m"} 1.0
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7543217059634e+09
`))
	f.Add([]byte("vllm:num_requests_running{engine=\"0\\\"} 1\n"))
	f.Add([]byte("vllm:num_requests_running 1e19\nvllm:cache_config_info{block_size=\"4294967296\",num_gpu_blocks=\"4294967296\"} 1\n" +
		"vllm:cache_config_info{block_size=\"2147483648\",num_gpu_blocks=\"2147483648\",engine=\"1\"} 1\n" +
		"vllm:cache_config_info{block_size=\"2147483648\",num_gpu_blocks=\"2147483648\",engine=\"2\"} 1\n"))
	f.Fuzz(func(t *testing.T, text []byte) {
		s, err := ParseEngineMetrics(text)
		if err != nil {
			if s != nil {
				t.Fatal("stats with an error")
			}
			if !errors.Is(err, ErrNoEngineMetrics) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if s.Running < 0 || s.Waiting < 0 || s.KVCapacityTokens < 0 || s.KVUsage < 0 || s.KVUsage > 1 || math.IsNaN(s.KVUsage) ||
			s.PrefixCacheHitRate < 0 || s.PrefixCacheHitRate > 1 || s.Reported == 0 {
			t.Fatalf("out of range: %+v", *s)
		}
		if !strings.Contains(string(text), "vllm:") {
			t.Fatal("stats from a body without vllm: names")
		}
	})
}
