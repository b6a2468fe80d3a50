package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Prefill/decode disaggregation, as vLLM's NixlConnector does it
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
// NIXL_CONNECTOR_VERSION 2; the router's half is
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py):
//
//  1. The router sends the request to a prefill replica with max_tokens 1,
//     stream false and kv_transfer_params {"do_remote_decode": true,
//     "do_remote_prefill": false, "remote_engine_id": null,
//     "remote_block_ids": null, "remote_host": null, "remote_port": null}.
//  2. The prefill replica computes the prompt, samples one token and
//     finishes with "length"; the connector's request_finished keeps the
//     request's KV blocks (instead of freeing them) and the response carries
//     kv_transfer_params {"do_remote_prefill": true, "do_remote_decode":
//     false, "remote_block_ids": [...], "remote_engine_id": E,
//     "remote_request_id": R, "remote_host": H, "remote_port": P,
//     "tp_size": T}. A request that ends otherwise (stop, abort) frees its
//     blocks at once and answers null.
//  3. The router sends the original request to a decode replica with those
//     kv_transfer_params. The decode replica's scheduler allocates blocks
//     for the prompt (after its own prefix-cache hits), parks the request
//     waiting for remote KVs (it counts as waiting), and its worker reads
//     the blocks from H:P; once read, the prefill replica frees them. The
//     decode replica then computes only the prompt's last token and
//     streams as usual.
//  4. Blocks nobody reads are freed after VLLM_NIXL_ABORT_REQUEST_TIMEOUT
//     (480 s). A read that fails is recomputed locally
//     (kv_load_failure_policy "recompute") or fails the request ("fail",
//     vLLM's default since the option exists).
//
// The simulator's read really crosses from one replica to the other: the
// decode replica POSTs to the prefill replica's side channel
// (http://H:P/sim/kv_transfer/pull), which answers the headers at once
// (the transfer is posted), then holds the response for the transfer time
// — whole blocks × block_size × the profile's KV bytes per token, over the
// slower of the two replicas' bandwidths — and frees the blocks when it
// has written it. A prefill replica killed or stalled meanwhile is a real
// failed read. NIXL's side channel is a ZMQ handshake followed by RDMA
// reads; the simulator's is plain HTTP on the same host:port pair.

// KVRole is vLLM's kv_role. NixlConnector does not act on it: whether a
// replica prefills or decodes a request is the router's choice, by the
// kv_transfer_params it sends (vLLM's docs, "KV Role Options"). The
// simulator does the same; the role tells the router and the reports
// what the replica is for.
type KVRole string

// The kv_role values vLLM accepts.
const (
	KVProducer KVRole = "kv_producer" // a prefill replica
	KVConsumer KVRole = "kv_consumer" // a decode replica
	KVBoth     KVRole = "kv_both"
)

// ParseKVRole reads --kv-transfer-role: prefill, decode or both, or
// vLLM's own kv_producer, kv_consumer, kv_both.
func ParseKVRole(s string) (KVRole, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "prefill", string(KVProducer):
		return KVProducer, nil
	case "decode", string(KVConsumer):
		return KVConsumer, nil
	case "both", string(KVBoth):
		return KVBoth, nil
	}
	return "", fmt.Errorf("%w: %q (want prefill, decode or both)", ErrKVTransferConfig, s)
}

// Short is the role as --kv-transfer-role names it: prefill, decode, both.
func (r KVRole) Short() string {
	switch r {
	case KVProducer:
		return "prefill"
	case KVConsumer:
		return "decode"
	}
	return "both"
}

// KV load failure policies (kv_load_failure_policy).
const (
	KVLoadRecompute = "recompute" // compute the prompt locally
	KVLoadFail      = "fail"      // fail the request with finish reason "error"
)

// Defaults of KVTransferConfig's zero fields.
const (
	// DefaultKVTransferBandwidthGBps is one ConnectX-7 NDR InfiniBand
	// port, 400 Gb/s = 50 GB/s: a DGX H100 has one per GPU (NVIDIA DGX
	// H100 User Guide, "Network Modules": each ConnectX-7 port maps to
	// one GPU), the link a KV cache crosses between a prefill and a
	// decode host over RDMA. Within one host NVLink 4 gives 450 GB/s each
	// way: pass that to model prefill and decode GPUs in one box.
	DefaultKVTransferBandwidthGBps = 50
	// DefaultKVSideChannelPort is VLLM_NIXL_SIDE_CHANNEL_PORT's default.
	DefaultKVSideChannelPort = 5600
	// DefaultKVAbortTimeout is VLLM_NIXL_ABORT_REQUEST_TIMEOUT's default:
	// how long a prefill replica holds blocks nobody has read.
	DefaultKVAbortTimeout = 480 * time.Second
	// DefaultKVPullTimeout bounds one read on the decode side. vLLM sets
	// none of its own (a stalled NIXL read waits until the client gives
	// up); the simulator's keeps a stalled prefill replica from holding a
	// decode request forever.
	DefaultKVPullTimeout = 10 * time.Second
)

// ErrKVTransferConfig marks an invalid KV transfer configuration.
var ErrKVTransferConfig = errors.New("sim: kv transfer config")

// KVTransferConfig makes a replica a NixlConnector replica, as vLLM's
// --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":…}'
// does. A nil *KVTransferConfig (the default) is a replica without a
// connector, which ignores kv_transfer_params as vLLM does. Zero fields
// take the defaults above.
type KVTransferConfig struct {
	// Role is kv_role. Required.
	Role KVRole
	// EngineID is the replica's engine_id, which it reports as
	// remote_engine_id and checks on every read. "" = one derived from the
	// replica's seed and index (vLLM: a random UUID). In a fleet of
	// several replicas, a given id gets "-i" appended for replica i.
	EngineID string
	// SideChannelHost is reported as remote_host (vLLM:
	// VLLM_NIXL_SIDE_CHANNEL_HOST, default "localhost"). "" = the address
	// the side channel listens on.
	SideChannelHost string
	// SideChannelPort is where the side channel listens and what
	// remote_port says (VLLM_NIXL_SIDE_CHANNEL_PORT; replica i of a fleet
	// listens on the port + i, as vLLM adds the data-parallel rank).
	// 0 = any free port.
	SideChannelPort int
	// BandwidthGBps is this replica's KV transfer bandwidth, 1e9 bytes/s;
	// a read goes at the slower of the two ends'. 0 =
	// DefaultKVTransferBandwidthGBps.
	BandwidthGBps float64
	// AbortTimeout frees held blocks nobody read. 0 = 480 s.
	AbortTimeout time.Duration
	// PullTimeout bounds one read on the decode side. 0 = 10 s.
	PullTimeout time.Duration
	// LoadFailurePolicy is kv_load_failure_policy: KVLoadRecompute
	// (the default here: the decode replica computes the prompt itself) or
	// KVLoadFail (vLLM's default).
	LoadFailurePolicy string
}

// withDefaults fills the zero fields.
func (c KVTransferConfig) withDefaults() KVTransferConfig {
	if c.BandwidthGBps == 0 {
		c.BandwidthGBps = DefaultKVTransferBandwidthGBps
	}
	if c.AbortTimeout == 0 {
		c.AbortTimeout = DefaultKVAbortTimeout
	}
	if c.PullTimeout == 0 {
		c.PullTimeout = DefaultKVPullTimeout
	}
	if c.LoadFailurePolicy == "" {
		c.LoadFailurePolicy = KVLoadRecompute
	}
	return c
}

// Validate checks c as vLLM's KVTransferConfig does, and what the
// simulator needs.
func (c KVTransferConfig) Validate() error {
	var errs []error
	switch c.Role {
	case KVProducer, KVConsumer, KVBoth:
	default:
		errs = append(errs, fmt.Errorf("kv_role %q: want kv_producer, kv_consumer or kv_both", c.Role))
	}
	switch c.LoadFailurePolicy {
	case "", KVLoadRecompute, KVLoadFail:
	default:
		errs = append(errs, fmt.Errorf("kv_load_failure_policy %q: want recompute or fail", c.LoadFailurePolicy))
	}
	if c.BandwidthGBps < 0 || c.AbortTimeout < 0 || c.PullTimeout < 0 {
		errs = append(errs, errors.New("bandwidth and timeouts must be >= 0"))
	}
	if c.SideChannelPort < 0 || c.SideChannelPort > 65535 {
		errs = append(errs, fmt.Errorf("side channel port %d out of range", c.SideChannelPort))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrKVTransferConfig, err)
	}
	return nil
}

// forReplica is the config of replica i of a fleet of n: the side
// channel port offset by i, a given engine id made unique.
func (c KVTransferConfig) forReplica(i, n int) KVTransferConfig {
	if c.SideChannelPort > 0 {
		c.SideChannelPort += i
	}
	if c.EngineID != "" && n > 1 {
		c.EngineID += "-" + strconv.Itoa(i)
	}
	return c
}

// vllmKVTransferConfig is vLLM's KVTransferConfig (vllm/config/kv_transfer.py)
// as --kv-transfer-config JSON spells it. Fields the simulator has no use
// for are accepted and ignored; unknown ones are errors, as vLLM's
// dataclass refuses them.
type vllmKVTransferConfig struct {
	KVConnector            *string         `json:"kv_connector"`
	EngineID               *string         `json:"engine_id"`
	KVBufferDevice         *string         `json:"kv_buffer_device"`
	KVBufferSize           *float64        `json:"kv_buffer_size"`
	KVRole                 *string         `json:"kv_role"`
	KVRank                 *int            `json:"kv_rank"`
	KVParallelSize         *int            `json:"kv_parallel_size"`
	KVIP                   *string         `json:"kv_ip"`
	KVPort                 *int            `json:"kv_port"`
	KVConnectorExtraConfig json.RawMessage `json:"kv_connector_extra_config"`
	KVConnectorModulePath  *string         `json:"kv_connector_module_path"`
	EnablePermuteLocalKV   *bool           `json:"enable_permute_local_kv"`
	KVLoadFailurePolicy    *string         `json:"kv_load_failure_policy"`
}

// ParseKVTransferConfig reads vLLM's --kv-transfer-config JSON into c
// (fields the JSON does not set keep c's values). The simulator models
// NixlConnector only.
func ParseKVTransferConfig(data string, c KVTransferConfig) (KVTransferConfig, error) {
	var v vllmKVTransferConfig
	dec := json.NewDecoder(bytes.NewReader([]byte(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return c, fmt.Errorf("%w: %w", ErrKVTransferConfig, err)
	}
	if v.KVConnector == nil || *v.KVConnector == "" {
		return c, fmt.Errorf("%w: kv_connector is required (the simulator models NixlConnector)", ErrKVTransferConfig)
	}
	if *v.KVConnector != "NixlConnector" {
		return c, fmt.Errorf("%w: kv_connector %q: the simulator models NixlConnector only", ErrKVTransferConfig, *v.KVConnector)
	}
	if v.KVRole == nil {
		// vLLM: "Please specify kv_disagg_role when kv_connector is set".
		return c, fmt.Errorf("%w: kv_role is required when kv_connector is set (kv_producer, kv_consumer or kv_both)", ErrKVTransferConfig)
	}
	role, err := ParseKVRole(*v.KVRole)
	if err != nil {
		return c, err
	}
	c.Role = role
	if v.EngineID != nil {
		c.EngineID = *v.EngineID
	}
	if v.KVLoadFailurePolicy != nil {
		c.LoadFailurePolicy = *v.KVLoadFailurePolicy
	}
	return c, c.Validate()
}

// kvTransferParamsIn is a request's kv_transfer_params as the connector
// reads them: a prefill request's {"do_remote_decode": true, …}, or a
// decode request's copy of a prefill response's. Other keys are ignored.
type kvTransferParamsIn struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteRequestID *string `json:"remote_request_id"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          *int    `json:"tp_size"`
}

// remote reports whether p names every field a read needs (vLLM's
// update_state_after_alloc checks the same ones; without them it warns
// "Got invalid KVTransferParams" and does not transfer).
func (p *kvTransferParamsIn) remote() bool {
	return p.RemoteEngineID != nil && p.RemoteRequestID != nil && p.RemoteHost != nil && p.RemotePort != nil &&
		len(p.RemoteBlockIDs) > 0
}

// kvTransferParamsOut is what a prefill response carries, keys in the
// order request_finished builds the dict (Python keeps it in JSON).
type kvTransferParamsOut struct {
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	RemoteBlockIDs  []int  `json:"remote_block_ids"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteRequestID string `json:"remote_request_id"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	TPSize          int    `json:"tp_size"`
}

// engineIDFor derives a replica's engine_id from its seed, index, role
// and side channel port (so that the replicas of two `gpurouter sim`
// processes differ), shaped as the UUID vLLM would draw.
func engineIDFor(seed uint64, index int, c KVTransferConfig) string {
	x := uint64(index) | uint64(c.SideChannelPort)<<16 | uint64(len(c.Role))<<40 | uint64(c.Role[len(c.Role)-1])<<48
	a, b := mix64(seed, x+0xe9), mix64(seed^0x5eed, x+0x1d)
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", a>>32, (a>>16)&0xffff, a&0xfff, b>>52, b&0xffffffffffff)
}
