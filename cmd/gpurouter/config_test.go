package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/balancer"
)

// configsDir holds the shipped example configurations.
const configsDir = "../../configs"

func TestConfigExamplesLoad(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(configsDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("found %d files in %s, want at least the example and minimal configs", len(files), configsDir)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if _, err := loadConfigFile(f); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestConfigRejects(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // substrings of the error
	}{
		{
			name: "unknown top-level key",
			yaml: "listne: :8080\npools: [{model: m, replicas: [{url: 'http://a:1'}]}]\n",
			want: []string{"listne: unknown key at line 1", "known keys: listen,"},
		},
		{
			name: "upstream head bound too small",
			yaml: "upstream: {max_header_bytes: 100}\npools: [{model: m, replicas: [{url: 'http://a:1'}]}]\n",
			want: []string{"upstream.max_header_bytes: must be >= 256, got 100"},
		},
		{
			name: "unknown nested key",
			yaml: "pools:\n  - model: m\n    replicas:\n      - url: http://a:1\n        wieght: 2\n",
			want: []string{"pools[0].replicas[0].wieght: unknown key at line 5", "weight"},
		},
		{
			// The walk does not follow aliases; the strict decode does.
			name: "unknown key through an alias",
			yaml: "log: &r {level: info}\npools: [{model: m, replicas: [*r]}]\n",
			want: []string{"line 1: field level not found"},
		},
		{
			name: "unknown key in a merge",
			yaml: "pools:\n  - model: m\n    replicas:\n      - <<: {url: 'http://a:1', wieght: 2}\n",
			want: []string{"pools[0].replicas[0].wieght: unknown key at line 4"},
		},
		{
			name: "duplicate key",
			yaml: "listen: :1\nlisten: :2\npools: [{model: m, replicas: [{url: 'http://a:1'}]}]\n",
			want: []string{`"listen" already defined`},
		},
		{
			name: "empty file",
			yaml: "",
			want: []string{"empty configuration"},
		},
		{
			name: "comments only",
			yaml: "# nothing\n",
			want: []string{"empty configuration"},
		},
		{
			name: "no pools",
			yaml: "listen: 127.0.0.1:9000\n",
			want: []string{"pools: at least one pool is required"},
		},
		{
			name: "two documents",
			yaml: "pools: [{model: m, replicas: [{url: 'http://a:1'}]}]\n---\nlisten: x\n",
			want: []string{"single YAML document"},
		},
		{
			name: "duration as a bare number",
			yaml: "timeouts: {connect: 2}\npools: [{model: m, replicas: [{url: 'http://a:1'}]}]\n",
			want: []string{"line 1", `durations are strings such as "2s"`},
		},
		{
			name: "tokenizer.json not there",
			yaml: "pools: [{model: m, replicas: [{url: 'http://a:1'}], prefix_cache: {mode: events, tokenizer: /nonexistent/tokenizer.json}, kv_events: {endpoint: 'tcp://{host}:5557'}}]\n",
			want: []string{"pools[0].prefix_cache.tokenizer: stat /nonexistent/tokenizer.json"},
		},
		{
			name: "tokenizer neither embedded nor a file",
			yaml: "pools: [{model: m, replicas: [{url: 'http://a:1'}], prefix_cache: {mode: events, tokenizer: llama3}, kv_events: {endpoint: 'tcp://{host}:5557'}}]\n",
			want: []string{"pools[0].prefix_cache.tokenizer: must be cl100k_base or o200k_base (embedded) or a tokenizer.json's path"},
		},
		{
			name: "syntax error",
			yaml: "pools: [\n",
			want: []string{"yaml:"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tt.yaml))
			assertErrContains(t, err, tt.want)
		})
	}
}

func TestConfigReportsEveryProblem(t *testing.T) {
	const bad = `
listen: "no-port"
log: {level: loud, format: xml}
timeouts: {connect: -1s, total: -5s}
limits: {max_body_bytes: 100}
retry: {max_attempts: -1, backoff_base: 1s, backoff_max: 500ms}
health: {interval: -2s, path: health}
breaker: {consecutive_failures: -3, half_open_requests: -1}
shutdown: {drain_timeout: -1s}
pools:
  - model: x
    policy: foo
    path_prefix: /chat/x
    replicas:
      - url: http://127.0.0.1:8001
        weight: -1
      - url: http://127.0.0.1:8001/
        gpu: {index: 0, agent_url: "http://h:9400"}
  - model: ""
    replicas:
      - url: ftp://127.0.0.1:8002
      - url: http://127.0.0.1:8003
        gpu: {agent_url: "http://h:9400"}
      - url: http://127.0.0.1:8004
        gpu: {dcgm_url: "http://h:9400/metrics"}
      - url: http://127.0.0.1:8005
        gpu: {label: "0"}
      - url: http://127.0.0.1:8006
        gpu: {}
      - url: http://127.0.0.1:8007
        gpu: {index: -1}
  - model: y
    aliases: [x]
    path_prefix: /v1/chat/y
    replicas: []
  - model: z
    path_prefix: /v1/chat/y/
`
	_, err := parseConfig([]byte(bad))
	assertErrContains(t, err, []string{
		"listen: must be HOST:PORT",
		"log.level: must be one of debug, info, warn, error",
		"log.format: must be one of json, console",
		"timeouts.connect: must be > 0",
		"timeouts.total: must be >= 0",
		"limits.max_body_bytes: must be >= 1024",
		"retry.max_attempts: must be >= 1",
		"retry.backoff_max: must be >= retry.backoff_base",
		"health.interval: must be > 0",
		"health.path: must start with /",
		"breaker.consecutive_failures: must be >= 1",
		"breaker.half_open_requests: must be >= 1",
		"shutdown.drain_timeout: must be >= 0",
		`pools[0].policy: unknown policy "foo" (known: least_loaded, least_request, round_robin`,
		"pools[0].path_prefix: must start with /v1/",
		"pools[0].replicas[0].weight: must be a finite number > 0",
		"pools[0].replicas[1].url: \"http://127.0.0.1:8001/\" duplicates replicas[0]",
		"pools[0].replicas[1].name: \"127.0.0.1:8001\" already used by replicas[0]",
		"pools[0].replicas[1].gpu: index selects a local GPU",
		"pools[1].model: required",
		"pools[1].replicas[0].url: must be an absolute http:// or https:// URL with a host",
		"pools[1].replicas[1].gpu.uuid: required with agent_url",
		"pools[1].replicas[2].gpu: dcgm_url needs exactly one of label or uuid",
		"pools[1].replicas[3].gpu.label: only used with dcgm_url",
		"pools[1].replicas[4].gpu: set one of index, uuid",
		"pools[1].replicas[5].gpu.index: must be >= 0",
		`pools[2].aliases[0]: "x" already names pools[0]`,
		"pools[2].replicas: at least one replica is required",
		`pools[3].path_prefix: "/v1/chat/y/" already used by pools[2]`,
		"pools[3].replicas: at least one replica is required",
	})
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := parseConfig([]byte("pools: [{model: m, replicas: [{url: 'http://10.0.0.7:8000'}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Pools[0].Replicas[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen", cfg.Listen, "0.0.0.0:8080"},
		{"log.level", cfg.Log.Level, "info"},
		{"log.format", cfg.Log.Format, "json"},
		{"timeouts.connect", cfg.Timeouts.Connect, 2 * time.Second},
		{"timeouts.first_byte", cfg.Timeouts.FirstByte, 120 * time.Second},
		{"timeouts.total", cfg.Timeouts.Total, time.Duration(0)},
		{"limits.max_body_bytes", cfg.Limits.MaxBodyBytes, 8 << 20},
		{"retry.max_attempts", cfg.Retry.MaxAttempts, 3},
		{"retry.backoff_max", cfg.Retry.BackoffMax, 200 * time.Millisecond},
		{"upstream.max_idle_conn_time", cfg.Upstream.MaxIdleConnTime, 4 * time.Second},
		{"upstream.max_header_bytes", cfg.Upstream.MaxHeaderBytes, 1024},
		{"upstream.goroutine_streams", cfg.Upstream.GoroutineStreams, false},
		{"upstream.stream_loops", cfg.Upstream.StreamLoops, 0},
		{"upstream.goroutine_requests", cfg.Upstream.GoroutineRequests, false},
		{"upstream.request_loops", cfg.Upstream.RequestLoops, 0},
		{"upstream.unbatched_io", cfg.Upstream.UnbatchedIO, false},
		{"health.path", cfg.Health.Path, "/health"},
		{"breaker.consecutive_failures", cfg.Breaker.ConsecutiveFailures, 5},
		{"shutdown.drain_timeout", cfg.Shutdown.DrainTimeout, 30 * time.Second},
		{"pool policy", cfg.Pools[0].Policy, "predictive"},
		{"telemetry.interval", cfg.Telemetry.Interval, 200 * time.Millisecond},
		{"telemetry.stale_after", cfg.Telemetry.StaleAfter, time.Second},
		{"telemetry.fail_open", cfg.Telemetry.FailOpen, false},
		{"routing.kv_threshold", cfg.Routing.KVThreshold, 0.9},
		{"routing.prefill_weight", cfg.Routing.PrefillWeight, 0.25},
		{"replica name", r.Name, "10.0.0.7:8000"},
		{"replica weight", r.Weight, 1.0},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestConfigFromFlags(t *testing.T) {
	tests := []struct {
		name    string
		listen  string
		pools   []string
		policy  string
		wantErr []string
		check   func(t *testing.T, cfg fileConfig)
	}{
		{
			name:   "ok",
			listen: "127.0.0.1:9000",
			pools:  []string{"llama=http://127.0.0.1:8001, http://127.0.0.1:8002", "tiny=http://127.0.0.1:8003"},
			policy: "round_robin",
			check: func(t *testing.T, cfg fileConfig) {
				if cfg.Listen != "127.0.0.1:9000" || len(cfg.Pools) != 2 {
					t.Fatalf("listen %q, %d pools", cfg.Listen, len(cfg.Pools))
				}
				p := cfg.Pools[0]
				if p.Model != "llama" || p.Policy != "round_robin" || len(p.Replicas) != 2 ||
					p.Replicas[1].URL != "http://127.0.0.1:8002" || p.Replicas[1].Name != "127.0.0.1:8002" {
					t.Errorf("pool 0 = %+v", p)
				}
			},
		},
		{
			name:  "defaults",
			pools: []string{"m=http://h:1"},
			check: func(t *testing.T, cfg fileConfig) {
				if cfg.Listen != defaultListen || cfg.Pools[0].Policy != balancer.DefaultPolicy {
					t.Errorf("listen %q policy %q", cfg.Listen, cfg.Pools[0].Policy)
				}
			},
		},
		{name: "no pools", wantErr: []string{"at least one --pool"}},
		{name: "missing =", pools: []string{"http://h:1"}, wantErr: []string{`--pool "http://h:1": want MODEL=URL`}},
		{name: "empty model", pools: []string{"=http://h:1"}, wantErr: []string{`--pool "=http://h:1": empty MODEL`}},
		{name: "empty URL", pools: []string{"m="}, wantErr: []string{`--pool "m=": URL 1 "": required`}},
		{name: "empty URL in list", pools: []string{"m=http://h:1,,http://h:2"}, wantErr: []string{`URL 2 "": required`}},
		{name: "bad URL", pools: []string{"m=h:1"}, wantErr: []string{`--pool "m=h:1": URL 1 "h:1": must be an absolute`}},
		{
			name:    "duplicate model",
			pools:   []string{"m=http://h:1", "m=http://h:2"},
			wantErr: []string{`--pool "m=http://h:2": model "m" already given by --pool "m=http://h:1"`},
		},
		{name: "unknown policy", pools: []string{"m=http://h:1"}, policy: "fastest", wantErr: []string{`--policy "fastest": unknown policy`}},
		{name: "bad listen", listen: "8080", pools: []string{"m=http://h:1"}, wantErr: []string{"listen: must be HOST:PORT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := configFromFlags(tt.listen, tt.pools, tt.policy)
			if tt.wantErr != nil {
				assertErrContains(t, err, tt.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, cfg)
		})
	}
}

func TestConfigPrintRoundTrip(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(configsDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	fromFlags, err := configFromFlags(":8081", []string{"m=http://h:1,https://h:2"}, "")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]fileConfig{"flags": fromFlags}
	for _, f := range files {
		cfg, err := loadConfigFile(f)
		if err != nil {
			t.Fatal(err)
		}
		cases[filepath.Base(f)] = cfg
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := writeConfigYAML(&buf, cfg); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			// Every option is printed, durations in their readable form.
			for _, want := range []string{"connect: 2s\n", "backoff_base: 10ms\n", "total: 0s\n", "max_body_bytes: 8388608\n", "policy: "} {
				if !strings.Contains(out, want) {
					t.Errorf("printed config lacks %q:\n%s", want, out)
				}
			}
			back, err := parseConfig(buf.Bytes())
			if err != nil {
				t.Fatalf("printed config does not load: %v\n%s", err, out)
			}
			if !reflect.DeepEqual(back, cfg) {
				t.Errorf("reloaded config differs:\n got %+v\nwant %+v\n%s", back, cfg, out)
			}
		})
	}
}

func FuzzParseConfig(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(configsDir, "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := parseConfig(data)
		if err != nil {
			return
		}
		// Whatever loads must print and load back unchanged: that is what
		// --print-config promises.
		var buf bytes.Buffer
		if err := writeConfigYAML(&buf, cfg); err != nil {
			t.Fatalf("print: %v", err)
		}
		back, err := parseConfig(buf.Bytes())
		if err != nil {
			t.Fatalf("printed config does not load: %v\n%s", err, buf.String())
		}
		if !reflect.DeepEqual(back, cfg) {
			t.Fatalf("reloaded config differs:\n got %+v\nwant %+v", back, cfg)
		}
	})
}

// assertErrContains fails unless err's text holds every one of want.
func assertErrContains(t *testing.T, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q; got:\n%v", w, err)
		}
	}
}

func TestConfigArmsAndTelemetryValidation(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // substrings of the error; none means valid
	}{
		{"valid experiment", `
pools:
  - model: m
    arms:
      - {name: ctl, policy: round_robin, share: 0.5}
      - {name: exp, policy: least_tokens}
    replicas: [{url: "http://127.0.0.1:9001"}]
`, nil},
		{"bad arms", `
pools:
  - model: m
    arms:
      - {name: a, policy: nope, share: -1}
      - {name: a, policy: p2c}
    replicas: [{url: "http://127.0.0.1:9001"}]
`, []string{`pools[0].arms[0].policy: unknown policy "nope"`, "pools[0].arms[0].share: must be > 0", `pools[0].arms[1].name: "a" already names another arm`}},
		{"one arm", `
pools:
  - model: m
    arms: [{name: a, policy: p2c}]
    replicas: [{url: "http://127.0.0.1:9001"}]
`, []string{"pools[0].arms: an experiment needs at least two arms"}},
		{"telemetry and routing ranges", `
telemetry: {interval: 1s, stale_after: 100ms}
routing: {kv_threshold: 1.5, prefill_weight: -1}
pools:
  - model: m
    replicas: [{url: "http://127.0.0.1:9001"}]
`, []string{"telemetry.stale_after: must be >= telemetry.interval", "routing.kv_threshold: must be in (0, 1)", "routing.prefill_weight: must be in (0, 1000]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tt.yaml))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// health.busy_grace is accepted (strict decoding would reject an unknown
// key), kept as written, negative included (off), and 0 when absent so the
// balancer derives it from the other health options.
func TestConfigHealthBusyGrace(t *testing.T) {
	for _, tt := range []struct {
		yaml string
		want time.Duration
	}{
		{"", 0},
		{"health: {busy_grace: 12s}\n", 12 * time.Second},
		{"health: {busy_grace: -1s}\n", -time.Second},
	} {
		cfg, err := parseConfig([]byte(tt.yaml + "pools: [{model: m, replicas: [{url: 'http://10.0.0.7:8000'}]}]\n"))
		if err != nil {
			t.Fatalf("%q: %v", tt.yaml, err)
		}
		if cfg.Health.BusyGrace != tt.want {
			t.Errorf("%q: busy_grace = %v, want %v", tt.yaml, cfg.Health.BusyGrace, tt.want)
		}
	}
}
