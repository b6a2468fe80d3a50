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
