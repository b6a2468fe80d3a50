package main

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
)

// The KV transfer flags are refused before anything listens when they do
// not make a connector, or not one the simulator models.
func TestSimKVTransferFlagsValidated(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"tuning without a role", []string{"--kv-transfer-bandwidth", "10"}, "needs --kv-transfer-role or --kv-transfer-config"},
		{"unknown role", []string{"--kv-transfer-role", "middle"}, "want prefill, decode or both"},
		{"another connector", []string{"--kv-transfer-config", `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`}, "NixlConnector only"},
		{"no kv_role", []string{"--kv-transfer-config", `{"kv_connector":"NixlConnector"}`}, "kv_role is required"},
		{"unknown key", []string{"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_rol":"x"}`}, "unknown field"},
		{"role and config disagree", []string{"--kv-transfer-role", "prefill", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}`}, "says kv_role kv_consumer"},
		{"failure policy", []string{"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"retry"}`}, "want recompute or fail"},
		{"bandwidth", []string{"--kv-transfer-role", "decode", "--kv-transfer-bandwidth", "0"}, "must be > 0"},
		{"fail rate", []string{"--kv-transfer-fail-rate", "2"}, "kv_transfer_fail_rate"},
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

// The flags make the connector vLLM's flags and environment would: the
// role (or the JSON's kv_role), the side channel from
// VLLM_NIXL_SIDE_CHANNEL_HOST/PORT, the abort timeout from
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT; none of them, no connector.
func TestSimKVTransferFlagsConfig(t *testing.T) {
	parse := func(t *testing.T, args ...string) *sim.KVTransferConfig {
		t.Helper()
		fs := flag.NewFlagSet("sim", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f := registerKVTransferFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		c, err := f.connector()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := parse(t); c != nil {
		t.Errorf("no flags: connector %+v", c)
	}
	t.Setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "10.0.0.7")
	t.Setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "5700")
	t.Setenv("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "30")
	c := parse(t, "--kv-transfer-role", "prefill")
	want := sim.KVTransferConfig{Role: sim.KVProducer, BandwidthGBps: 50, SideChannelHost: "10.0.0.7", SideChannelPort: 5700,
		AbortTimeout: 30 * time.Second, PullTimeout: sim.DefaultKVPullTimeout}
	if c == nil || *c != want {
		t.Errorf("--kv-transfer-role prefill: %+v\nwant %+v", c, want)
	}
	c = parse(t, "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_consumer","engine_id":"d0","kv_load_failure_policy":"fail"}`,
		"--kv-transfer-bandwidth", "450", "--kv-transfer-side-channel-port", "0")
	if c == nil || c.Role != sim.KVConsumer || c.EngineID != "d0" || c.LoadFailurePolicy != sim.KVLoadFail || c.BandwidthGBps != 450 ||
		c.SideChannelPort != 0 {
		t.Errorf("--kv-transfer-config: %+v", c)
	}
}

// sim predict models a split fleet in virtual time and judges goodput on
// vllm bench's --goodput form.
func TestSimPredictSplitFleet(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := runSimPredict([]string{"--profile", "qwen3.5-9b-h100", "--prefill-replicas", "1", "--decode-replicas", "2",
		"--num-prompts", "20", "--request-rate", "1", "--random-input-len", "4000", "--random-output-len", "50",
		"--goodput", "ttft:2000", "tpot:50"}, &stdout, &stderr)
	out := stdout.String()
	for _, want := range []string{"1P+2D split", "Request goodput (req/s):", "KV reads:                                20"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("exit %d, no %q in\n%s%s", code, want, out, stderr.String())
		}
	}
	if code := runSimPredict([]string{"--goodput", "e2el:5"}, &stdout, &stderr); code != 2 {
		t.Errorf("--goodput e2el: exit %d", code)
	}
}
