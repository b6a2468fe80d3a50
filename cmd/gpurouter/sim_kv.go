package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gpurouter/gpurouter/bench/sim"
)

// kvTransferFlags are `gpurouter sim`'s prefill/decode disaggregation
// flags: --kv-transfer-role or vLLM's --kv-transfer-config turn a
// NixlConnector on; the others tune it and need one of them. Defaults
// read vLLM's environment variables where vLLM has one.
type kvTransferFlags struct {
	fs          *flag.FlagSet
	role        *string
	configJSON  *string
	bandwidth   *float64
	host        *string
	port        *int
	abort       *time.Duration
	pullTimeout *time.Duration
}

func registerKVTransferFlags(fs *flag.FlagSet) *kvTransferFlags {
	return &kvTransferFlags{
		fs: fs,
		role: fs.String("kv-transfer-role", "",
			"take part in prefill/decode disaggregation as vLLM's NixlConnector: prefill, decode or both (kv_role kv_producer, kv_consumer, kv_both); empty = no connector, kv_transfer_params ignored"),
		configJSON: fs.String("kv-transfer-config", "",
			`vLLM's --kv-transfer-config JSON, e.g. '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"recompute"}' (NixlConnector only; kv_role, engine_id and kv_load_failure_policy are used; --kv-transfer-role, when given too, must agree)`),
		bandwidth: fs.Float64("kv-transfer-bandwidth", sim.DefaultKVTransferBandwidthGBps,
			"KV transfer bandwidth, GB/s (1e9 bytes/s); a read goes at the slower end's. Default: one 400 Gb/s ConnectX-7 NDR port, RDMA between hosts (450: NVLink 4 within a host)"),
		host: fs.String("kv-transfer-side-channel-host", os.Getenv("VLLM_NIXL_SIDE_CHANNEL_HOST"),
			"the side channel's address, reported as remote_host (default: $VLLM_NIXL_SIDE_CHANNEL_HOST, else --host)"),
		port: fs.Int("kv-transfer-side-channel-port", envInt("VLLM_NIXL_SIDE_CHANNEL_PORT", sim.DefaultKVSideChannelPort),
			"the side channel's port, reported as remote_port; replica i listens on PORT+i; 0 = any free port (default: $VLLM_NIXL_SIDE_CHANNEL_PORT, else 5600)"),
		abort: fs.Duration("kv-transfer-abort-timeout", envSeconds("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", sim.DefaultKVAbortTimeout),
			"free a prefilled request's held KV blocks nobody read within this (default: $VLLM_NIXL_ABORT_REQUEST_TIMEOUT seconds, else 480s)"),
		pullTimeout: fs.Duration("kv-transfer-pull-timeout", sim.DefaultKVPullTimeout,
			"give up a KV read from a prefill replica after this (the simulator's own: a stalled vLLM read has no deadline)"),
	}
}

// errKVFlags marks KV transfer flags that do not fit together.
var errKVFlags = errors.New("KV transfer flags")

// connector is the connector the flags describe; nil when neither
// --kv-transfer-role nor --kv-transfer-config was given.
func (f *kvTransferFlags) connector() (*sim.KVTransferConfig, error) {
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if *f.role == "" && *f.configJSON == "" {
		for name := range set {
			if strings.HasPrefix(name, "kv-transfer-") && !isKVFaultFlag(name) {
				return nil, fmt.Errorf("%w: --%s needs --kv-transfer-role or --kv-transfer-config", errKVFlags, name)
			}
		}
		return nil, nil
	}
	c := sim.KVTransferConfig{BandwidthGBps: *f.bandwidth, SideChannelHost: *f.host, SideChannelPort: *f.port,
		AbortTimeout: *f.abort, PullTimeout: *f.pullTimeout}
	var err error
	if *f.configJSON != "" {
		if c, err = sim.ParseKVTransferConfig(*f.configJSON, c); err != nil {
			return nil, err
		}
	}
	if *f.role != "" {
		role, err := sim.ParseKVRole(*f.role)
		if err != nil {
			return nil, err
		}
		if *f.configJSON != "" && role != c.Role {
			return nil, fmt.Errorf("%w: --kv-transfer-role %s but --kv-transfer-config says kv_role %s", errKVFlags, *f.role, c.Role)
		}
		c.Role = role
	}
	if c.BandwidthGBps <= 0 {
		return nil, fmt.Errorf("%w: --kv-transfer-bandwidth must be > 0", errKVFlags)
	}
	return &c, c.Validate()
}

// isKVFaultFlag tells the fault flags (sim.RegisterFaultFlags) apart: they
// need no connector to be given, only to matter.
func isKVFaultFlag(name string) bool {
	switch name {
	case "kv-transfer-stall", "kv-transfer-crash", "kv-transfer-fail-rate":
		return true
	}
	return false
}

// printKVTransfer writes replica i's connector line, if it has one.
func printKVTransfer(w io.Writer, i int, r *sim.Replica) {
	c, ok := r.KVTransfer()
	if !ok {
		return
	}
	fmt.Fprintf(w, "replica %d KV transfer: role=%s kv_role=%s engine_id=%s side_channel=%s bandwidth=%gGB/s abort_timeout=%v kv_load_failure_policy=%s\n",
		i, c.Role.Short(), c.Role, c.EngineID, r.KVSideChannelAddr(), c.BandwidthGBps, c.AbortTimeout, c.LoadFailurePolicy)
}

// envInt is an integer environment variable, def when unset or not one.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(strings.TrimSpace(os.Getenv(name))); err == nil {
		return n
	}
	return def
}

// envSeconds is an environment variable of whole seconds, as vLLM reads
// its timeouts.
func envSeconds(name string, def time.Duration) time.Duration {
	if n, err := strconv.Atoi(strings.TrimSpace(os.Getenv(name))); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	return def
}

// fleetText describes a predicted fleet in one line.
func fleetText(f sim.FleetShape) string {
	if f.Split() {
		return fmt.Sprintf("%dP+%dD split, KV reads at %g GB/s", f.Prefill, f.Decode, f.BandwidthGBps)
	}
	return fmt.Sprintf("%d colocated", max(f.Replicas, 1))
}

// parsePredictSLOs reads `sim predict --goodput`: "ttft:MS tpot:MS"
// (either, space- or comma-separated), as vllm bench's --goodput.
func parsePredictSLOs(s string) ([2]time.Duration, error) {
	var out [2]time.Duration
	for _, kv := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' }) {
		k, v, ok := strings.Cut(kv, ":")
		ms, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || ms <= 0 {
			return out, fmt.Errorf("%q: want ttft:MS or tpot:MS", kv)
		}
		d := time.Duration(ms * float64(time.Millisecond))
		switch k {
		case "ttft":
			out[0] = d
		case "tpot":
			out[1] = d
		default:
			return out, fmt.Errorf("%q: only ttft and tpot are judged here", kv)
		}
	}
	return out, nil
}
