package main

import (
	"bytes"
	"strings"
	"testing"
)

// The fault flags reach the fleet's faults: an invalid value is refused by
// their validation, with the JSON field named, before anything listens.
func TestSimFaultFlagsValidated(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"retry-after", []string{"--retry-after", "-2"}, "retry_after_seconds"},
		{"max-waiting-queue-length", []string{"--max-waiting-queue-length", "-1"}, ">= 0"},
		{"flag over --faults", []string{"--faults", `{"retry_after_seconds":3}`, "--retry-after=-5"}, "retry_after_seconds -5"},
		{"kv-events-lose-rate", []string{"--kv-events-lose-rate", "2"}, "kv_events_"},
		{"kv-events-encoding", []string{"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-encoding", "json"}, "array or map"},
		{"kv-events-replay-endpoint alone", []string{"--kv-events-replay-endpoint", "tcp://127.0.0.1:0"}, "needs --kv-events-endpoint"},
		{"kv-events-endpoint not tcp", []string{"--kv-events-endpoint", "ipc:///tmp/x"}, "tcp://host:port"},
		{"kv events without prefix caching", []string{"--kv-events-endpoint", "tcp://127.0.0.1:0", "--no-enable-prefix-caching"}, "prefix caching"},
		{"lora modules without --enable-lora", []string{"--lora-modules", "a=/adapters/a"}, "LoRA is not enabled"},
		{"lora module without a path", []string{"--enable-lora", "--lora-modules", "a"}, "want name=path"},
		{"lora module twice", []string{"--enable-lora", "--lora-modules", "a=/x", "a=/y"}, "already been loaded"},
		{"max-cpu-loras below max-loras", []string{"--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"}, "max_cpu_loras (2) must be >= max_loras (4)"},
		{"max-lora-rank", []string{"--enable-lora", "--max-lora-rank", "12"}, "max_lora_rank (12)"},
		{"lora-load-delay", []string{"--lora-load-delay", "-1s"}, ">= 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runSim(append([]string{"--base-port", "0"}, c.args...), &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), c.want) {
				t.Errorf("exit %d, stderr %q: want 2 and %q", code, stderr.String(), c.want)
			}
			if strings.Contains(stdout.String(), "ready") {
				t.Errorf("a replica started: %s", stdout.String())
			}
		})
	}
}

// vLLM's --lora-modules takes several values after one flag; each value is
// name=path or a JSON object (commas and all).
func TestSimLoRAModulesFlag(t *testing.T) {
	args := expandLoRAModules([]string{"--replicas", "2", "--lora-modules", "a=/p/a", "b=/p/b", `{"name":"c","path":"/p/c"}`,
		"--enable-lora", "--lora-modules", "d=/p/d,e=/p/e"})
	want := []string{"--replicas", "2", "--lora-modules", "a=/p/a", "--lora-modules", "b=/p/b", "--lora-modules",
		`{"name":"c","path":"/p/c"}`, "--enable-lora", "--lora-modules", "d=/p/d,e=/p/e"}
	if strings.Join(args, " ") != strings.Join(want, " ") {
		t.Fatalf("expanded %q\nwant     %q", args, want)
	}
	var l simList
	f := &loraModulesFlag{&l}
	for _, v := range []string{"a=/p/a", `{"name":"c","path":"/p/c,x"}`, "d=/p/d, e=/p/e"} {
		if err := f.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(l, "|"); got != `a=/p/a|{"name":"c","path":"/p/c,x"}|d=/p/d|e=/p/e` {
		t.Errorf("values %q", got)
	}
	for v, want := range map[string]bool{"1": true, "True": true, "true": true, "0": false, "": false, "yes": false} {
		if envTrue(v) != want {
			t.Errorf("envTrue(%q) = %v", v, !want)
		}
	}
}
