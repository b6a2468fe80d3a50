package gpu

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
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
	all := FieldRunning | FieldWaiting | FieldKVUsage | FieldKVCapacity | FieldPrefixCache | FieldPreemptions | FieldFinished
	load := FieldRunning | FieldWaiting | FieldKVUsage | FieldKVCapacity
	for _, tc := range []struct {
		name, file string
		want       EngineStats
		wantErr    error
	}{
		{name: "v1 names, one engine", file: "vllm_v1.txt", want: EngineStats{Running: 8, Waiting: 2, KVUsage: 0.4127,
			KVCapacityTokens: 27000 * 16, KVBlockSize: 16, PrefixCacheQueries: 250000, PrefixCacheHits: 225000, PrefixCacheHitRate: 0.9,
			PreemptionsTotal: 3, RequestsFinished: 1000, Engines: 1, Reported: all, Engine: EngineVLLM}},
		{name: "v0.10 exposes both KV names: the new one wins", file: "vllm_v010.txt", want: EngineStats{Running: 5,
			KVUsage: 0.25, KVCapacityTokens: 12000 * 16, KVBlockSize: 16, PrefixCacheQueries: 1000, PrefixCacheHits: 400,
			PrefixCacheHitRate: 0.4, RequestsFinished: 1000, Engines: 1, Reported: all, Engine: EngineVLLM}},
		{name: "old gpu_cache_usage_perc and gpu_prefix_cache names, no engine label", file: "vllm_old.txt",
			want: EngineStats{Running: 3, Waiting: 7, KVUsage: 0.91, KVCapacityTokens: 8192 * 32, KVBlockSize: 32,
				PrefixCacheQueries: 80000, PrefixCacheHits: 20000, PrefixCacheHitRate: 0.25, PreemptionsTotal: 12,
				RequestsFinished: 1000, Engines: 1, Reported: all, Engine: EngineVLLM}},
		{name: "three data-parallel engines: sums and a mean", file: "vllm_dp.txt", want: EngineStats{Running: 22,
			Waiting: 5, KVUsage: 0.5, KVCapacityTokens: 3 * 5000 * 16, KVBlockSize: 16, PrefixCacheQueries: 400, PrefixCacheHits: 200,
			PrefixCacheHitRate: 0.5, PreemptionsTotal: 3, RequestsFinished: 3000, Engines: 3, Reported: all, Engine: EngineVLLM}},
		{name: "missing families are reported as missing", file: "vllm_partial.txt",
			want: EngineStats{Running: 4, Waiting: 1, Engines: 1, Reported: FieldRunning | FieldWaiting, Engine: EngineVLLM}},
		{name: "sglang: running, queue, token usage, pool size", file: "sglang.txt", want: EngineStats{Running: 12,
			Waiting: 3, KVUsage: 0.41, KVCapacityTokens: 459876, Engines: 1, Reported: load, Engine: EngineSGLang}},
		{name: "sglang: two dp ranks, each reported by two tp schedulers: one copy per rank, summed", file: "sglang_dp.txt",
			want: EngineStats{Running: 16, Waiting: 2, KVUsage: 0.4, KVCapacityTokens: 400000, Engines: 2, Reported: load,
				Engine: EngineSGLang}},
		{name: "llama.cpp: processing and deferred, KV usage unknown", file: "llamacpp.txt", want: EngineStats{Running: 4,
			Waiting: 46, Engines: 1, Reported: FieldRunning | FieldWaiting, Engine: EngineLlamaCpp}},
		{name: "llama.cpp before May 2025: kv_cache_usage_ratio read", file: "llamacpp_old.txt", want: EngineStats{
			Running: 1, KVUsage: 0.28125, Engines: 1, Reported: FieldRunning | FieldWaiting | FieldKVUsage,
			Engine: EngineLlamaCpp}},
		{name: "tgi: batch size and queue size, KV usage unknown", file: "tgi.txt", want: EngineStats{Running: 7,
			Waiting: 2, Engines: 1, Reported: FieldRunning | FieldWaiting, Engine: EngineTGI}},
		{name: "garbage", file: "garbage.txt", wantErr: ErrNoEngineMetrics},
		{name: "DCGM exporter: no engine at all", file: "dcgm.txt", wantErr: ErrNoEngineMetrics},
		{name: "malformed line of a needed family", file: "vllm_malformed.txt", wantErr: ErrMalformed},
		// LoRA: vllm_lora.txt is vllm_v1.txt with vllm:lora_requests_info's
		// history as vLLM 0.12+ exposes it (both labels list every adapter
		// with a request): series in the order their label sets first
		// appeared, the newest (largest value) in the middle. That series
		// is a real line, from a vLLM 0.29 server's /metrics; the other two
		// are built from vllm/v1/metrics/loggers.py (labels max_lora,
		// running_lora_adapters, waiting_lora_adapters; value
		// set_to_current_time()).
		{name: "lora: the newest series, not the last", file: "vllm_lora.txt", want: EngineStats{Running: 8, Waiting: 2, KVUsage: 0.4127,
			KVCapacityTokens: 27000 * 16, KVBlockSize: 16, PrefixCacheQueries: 250000, PrefixCacheHits: 225000, PrefixCacheHitRate: 0.9,
			PreemptionsTotal: 3, RequestsFinished: 1000, Engines: 1, Reported: all | FieldLoRA, Engine: EngineVLLM,
			LoRA: LoRAStats{Running: []string{"alpaca"}, Waiting: []string{"alpaca"}, MaxLoRAs: 2,
				Updated: time.Unix(1789828498, 802105000).UTC()}}},
		// vLLM up to 0.11 (LoRARequestStates.update_iteration_stats) lists
		// running and waiting adapters apart; built from that code.
		{name: "lora: running and waiting apart", file: "vllm_lora_split.txt", want: EngineStats{Running: 62, Waiting: 44,
			KVUsage: 0.63, Engines: 1, Reported: FieldRunning | FieldWaiting | FieldKVUsage | FieldLoRA, Engine: EngineVLLM,
			LoRA: LoRAStats{Running: []string{"a1", "a3", "a6", "a7"}, Waiting: []string{"a0", "a2", "a4", "a5"}, MaxLoRAs: 4,
				Updated: time.Unix(1754321843, 777241700).UTC()}}},
		// A real V0 /metrics (vLLM ~0.7, from vllm-project/aibrix's docs;
		// its histogram, cut short there, left out): V0 exposes the LoRA
		// family with max_lora="0" when LoRA is off, which is no report.
		{name: "lora off in vLLM V0: max_lora 0", file: "vllm_v0_lora_off.txt", want: EngineStats{KVCapacityTokens: 81767 * 16, KVBlockSize: 16,
			RequestsFinished: 4, Engines: 1, Reported: load | FieldPreemptions | FieldFinished, Engine: EngineVLLM}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseEngineMetrics(readTestdata(t, tc.file))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != nil {
					t.Fatalf("err = %v (stats %v), want %v", err, got, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !sameStats(got, &tc.want) {
				t.Errorf("got  %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}

// sameStats compares what a parse fills in (At, Latency and Preemptions
// must still be zero), floats to 1e-9.
func sameStats(got, w *EngineStats) bool {
	return got.Engine == w.Engine && got.Running == w.Running && got.Waiting == w.Waiting &&
		near(got.KVUsage, w.KVUsage) && got.KVCapacityTokens == w.KVCapacityTokens && got.KVBlockSize == w.KVBlockSize &&
		near(got.PrefixCacheQueries, w.PrefixCacheQueries) && near(got.PrefixCacheHits, w.PrefixCacheHits) &&
		near(got.PrefixCacheHitRate, w.PrefixCacheHitRate) && got.PreemptionsTotal == w.PreemptionsTotal &&
		got.RequestsFinished == w.RequestsFinished && sameLoRA(got.LoRA, w.LoRA) &&
		got.Preemptions == 0 && got.Engines == w.Engines && got.Reported == w.Reported && got.At.IsZero() &&
		got.Latency == 0
}

// sameLoRA compares LoRA reports, Updated to the microsecond (the gauge
// is a float of Unix seconds).
func sameLoRA(a, b LoRAStats) bool {
	d := a.Updated.Sub(b.Updated)
	return slices.Equal(a.Running, b.Running) && slices.Equal(a.Waiting, b.Waiting) && a.MaxLoRAs == b.MaxLoRAs &&
		d < time.Microsecond && d > -time.Microsecond
}

// A configured engine reads its own families only: another engine's body
// is "no engine metrics", not a misread.
func TestEngineParserConfigured(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		engine  Engine
		file    string
		running int
		wantErr error
	}{
		{EngineVLLM, "vllm_v1.txt", 8, nil},
		{EngineSGLang, "sglang.txt", 12, nil},
		{EngineLlamaCpp, "llamacpp.txt", 4, nil},
		{EngineTGI, "tgi.txt", 7, nil},
		{EngineVLLM, "sglang.txt", 0, ErrNoEngineMetrics},
		{EngineSGLang, "vllm_v1.txt", 0, ErrNoEngineMetrics},
		{EngineTGI, "llamacpp.txt", 0, ErrNoEngineMetrics},
		{EngineLlamaCpp, "garbage.txt", 0, ErrNoEngineMetrics},
	} {
		t.Run(string(tc.engine)+"/"+tc.file, func(t *testing.T) {
			t.Parallel()
			p := newEngineParser(tc.engine)
			for range 2 { // the reused buffers must not leak one parse into the next
				s, err := p.parse(readTestdata(t, tc.file))
				switch {
				case tc.wantErr != nil:
					if !errors.Is(err, tc.wantErr) || s != nil {
						t.Fatalf("err = %v (stats %v), want %v", err, s, tc.wantErr)
					}
				case err != nil:
					t.Fatal(err)
				case s.Engine != tc.engine || s.Running != tc.running:
					t.Fatalf("%+v", *s)
				}
			}
		})
	}
}

// Detection takes the first known prefix, and a parser detects afresh in
// every body: an engine swapped behind the same URL is read as what it is.
func TestEngineDetection(t *testing.T) {
	t.Parallel()
	p := newEngineParser(EngineAuto)
	for _, tc := range []struct {
		text string
		want Engine
	}{
		{"python_gc_objects_collected_total 1\nsglang:num_queue_reqs 4\nvllm:num_requests_waiting 9\n", EngineSGLang},
		{"vllm:num_requests_waiting 9\nsglang:num_queue_reqs 4\n", EngineVLLM},
		{"# HELP tgi_queue_size x\ntgi_queue_size 1\n", EngineTGI},
		{"llamacpp:requests_deferred 2\n", EngineLlamaCpp},
	} {
		s, err := p.parse([]byte(tc.text))
		if err != nil || s.Engine != tc.want || s.Waiting == 0 {
			t.Errorf("%q: %v %+v, want %s", tc.text, err, s, tc.want)
		}
	}
	// The first known prefix decides even when that engine's load families
	// are missing: a body is read as one engine, never patched from two.
	if s, err := p.parse([]byte("sglang:prompt_tokens_total 5\nvllm:num_requests_running 1\n")); !errors.Is(err, ErrNoEngineMetrics) {
		t.Errorf("stats %+v err %v", s, err)
	} else if !strings.Contains(err.Error(), "sglang") {
		t.Errorf("error does not name the engine found: %v", err)
	}
}

func TestParseEngine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Engine{"": EngineAuto, "auto": EngineAuto, "vllm": EngineVLLM, "sglang": EngineSGLang,
		"llamacpp": EngineLlamaCpp, "tgi": EngineTGI, "none": EngineNone} {
		if got, err := ParseEngine(in); err != nil || got != want {
			t.Errorf("ParseEngine(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"VLLM", "llama.cpp", "trtllm", " vllm"} {
		if _, err := ParseEngine(bad); err == nil || !strings.Contains(err.Error(), "want vllm, sglang, llamacpp, tgi, none or auto") {
			t.Errorf("ParseEngine(%q): %v", bad, err)
		}
	}
	if EngineAuto.String() != "auto" || EngineSGLang.String() != "sglang" {
		t.Error("String")
	}
}

// The goldens must be valid expositions as a whole (so that they test our
// filter, not a broken file), except the two that are broken on purpose.
func TestGoldensAreValidExpositions(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("testdata/*.txt")
	if len(files) < 12 {
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
				if err != nil || s.Reported.Has(FieldKVCapacity) || s.KVCapacityTokens != 0 || s.KVBlockSize != 16 {
					t.Errorf("%v %+v", err, s)
				}
			}},
		{"engines of two block sizes: none is the replica's", `vllm:kv_cache_usage_perc 0.1` + "\n" +
			`vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1` + "\n" +
			`vllm:cache_config_info{block_size="32",engine="1",num_gpu_blocks="100"} 1` + "\n",
			func(t *testing.T, s *EngineStats, err error) {
				if err != nil || s.KVBlockSize != 0 || s.KVCapacityTokens != 4800 {
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
		{"lora: spaces after commas, equal values (the last wins), NaN series ignored", "vllm:num_requests_running 1\n" +
			`vllm:lora_requests_info{max_lora="8",running_lora_adapters="x",waiting_lora_adapters=""} 1.5e9` + "\n" +
			`vllm:lora_requests_info{max_lora="8",running_lora_adapters="adapter1, adapter2",waiting_lora_adapters=" ,y"} 1.5e9` + "\n" +
			`vllm:lora_requests_info{max_lora="8",running_lora_adapters="z",waiting_lora_adapters=""} NaN` + "\n",
			func(t *testing.T, s *EngineStats, err error) {
				want := LoRAStats{Running: []string{"adapter1", "adapter2"}, Waiting: []string{"y"}, MaxLoRAs: 8, Updated: time.Unix(1.5e9, 0)}
				if err != nil || !s.Reported.Has(FieldLoRA) || !sameLoRA(s.LoRA, want) {
					t.Errorf("%v %+v", err, s)
				}
			}},
		{"lora: the newest series says LoRA off, or no max_lora", "vllm:num_requests_running 1\n" +
			`vllm:lora_requests_info{max_lora="4",running_lora_adapters="x",waiting_lora_adapters=""} 1` + "\n" +
			`vllm:lora_requests_info{max_lora="",running_lora_adapters="x",waiting_lora_adapters=""} 2` + "\n",
			func(t *testing.T, s *EngineStats, err error) {
				if err != nil || s.Reported.Has(FieldLoRA) || s.LoRA.MaxLoRAs != 0 || s.LoRA.Running != nil {
					t.Errorf("%v %+v", err, s)
				}
			}},
		{"lora alone is no engine report", `vllm:lora_requests_info{max_lora="4",running_lora_adapters="x",waiting_lora_adapters=""} 1` + "\n",
			func(t *testing.T, s *EngineStats, err error) {
				if !errors.Is(err, ErrNoEngineMetrics) {
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
	// Small seeds: the big vLLM goldens (50–110 KB) make the fuzzer spend
	// its time minimising, so these cover their line shapes; the other
	// engines' goldens are small and go in whole.
	for _, name := range []string{"vllm_partial.txt", "vllm_malformed.txt", "garbage.txt",
		"sglang.txt", "sglang_dp.txt", "llamacpp.txt", "llamacpp_old.txt", "tgi.txt"} {
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
	f.Add([]byte("vllm:num_requests_running 1\n" + `vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9` + "\n" +
		`vllm:lora_requests_info{max_lora="99999999999",running_lora_adapters=",",waiting_lora_adapters="c"} 1e300` + "\n"))
	f.Add([]byte("sglang:num_running_reqs{dp_rank=\"0\"} 1e300\nsglang:num_running_reqs{dp_rank=\"1\"} 1e300\n" +
		"sglang:max_total_num_tokens{dp_rank=\"0\"} 1e300\nsglang:token_usage NaN\n"))
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
			s.PrefixCacheHitRate < 0 || s.PrefixCacheHitRate > 1 || s.Reported == 0 ||
			s.Reported.Has(FieldLoRA) != (s.LoRA.MaxLoRAs > 0) || slices.Contains(s.LoRA.Running, "") || slices.Contains(s.LoRA.Waiting, "") {
			t.Fatalf("out of range: %+v", *s)
		}
		if s.Engine.prefix() == "" || !strings.Contains(string(text), s.Engine.prefix()) {
			t.Fatalf("stats of engine %q from a body without its names", s.Engine)
		}
	})
}
