package main

import "time"

// fileConfig is the YAML schema of `gpurouter serve --config FILE`. It is
// decoded strictly (unknown keys are errors), completed by applyDefaults and
// checked by validate, then translated into each package's own Config by
// the serve wiring. Every field is documented, with its default and unit, in
// configs/gpurouter.example.yaml.
type fileConfig struct {
	Listen    string          `yaml:"listen"`
	Log       logConfig       `yaml:"log"`
	Timeouts  timeoutsConfig  `yaml:"timeouts"`
	Limits    limitsConfig    `yaml:"limits"`
	Retry     retryConfig     `yaml:"retry"`
	Upstream  upstreamConfig  `yaml:"upstream"`
	Health    healthConfig    `yaml:"health"`
	Breaker   breakerConfig   `yaml:"breaker"`
	Shutdown  shutdownConfig  `yaml:"shutdown"`
	Telemetry telemetryConfig `yaml:"telemetry"`
	Tracing   tracingConfig   `yaml:"tracing"`
	Admission admissionConfig `yaml:"admission"`
	Admin     adminConfig     `yaml:"admin"`
	Auth      authConfig      `yaml:"auth"`
	Routing   routingConfig   `yaml:"routing"`
	Pools     []poolConfig    `yaml:"pools"`
}

// telemetryConfig is how the router watches its replicas: vLLM /metrics
// scrapes and GPU reads (NVML, agent, DCGM), and what stale data means.
type telemetryConfig struct {
	Disabled    bool          `yaml:"disabled"`     // no scraping: policies use router-side counts only; default false
	Interval    time.Duration `yaml:"interval"`     // engine /metrics scrape period per replica; default 200ms
	Timeout     time.Duration `yaml:"timeout"`      // one scrape; default 500ms
	GPUInterval time.Duration `yaml:"gpu_interval"` // GPU read period per replica; default 1s
	StaleAfter  time.Duration `yaml:"stale_after"`  // engine numbers older than this no longer count; default 1s
	FailOpen    bool          `yaml:"fail_open"`    // stale: false = treat as saturated (avoid), true = use router counts; default false
}

// tracingConfig is OpenTelemetry tracing of requests (package tracing):
// where the spans go over OTLP and which requests are recorded. No
// endpoint, no tracing: the router then costs nothing for it and passes a
// client's traceparent to the engine untouched.
type tracingConfig struct {
	Endpoint string `yaml:"endpoint"` // OTLP receiver, http://HOST:PORT (plain text) or https://HOST:PORT (TLS); "" = off; default ""
	Protocol string `yaml:"protocol"` // grpc | http (protobuf; a URL without a path gets /v1/traces); default grpc
	// Headers go with every export (an API key, a tenant); --print-config
	// shows their values as REDACTED. Default: none (then
	// OTEL_EXPORTER_OTLP_TRACES_HEADERS applies).
	Headers map[string]string `yaml:"headers"`
	// SamplingRatio is the share of the traces the router starts (requests
	// without a traceparent) that are recorded, 0–1; a caller's sampled
	// flag decides for its own requests. Default 1.
	SamplingRatio *float64 `yaml:"sampling_ratio"`
	// ResourceAttributes describe this router on every span
	// (deployment.environment.name, ...); service.name is gpurouter unless
	// set here or by OTEL_SERVICE_NAME. Default: none.
	ResourceAttributes map[string]string `yaml:"resource_attributes"`
	Timeout            time.Duration     `yaml:"timeout"` // one export, and the flush at shutdown; default 10s
}

// adminConfig is the operators' API: its own listener, behind a token.
type adminConfig struct {
	Listen string `yaml:"listen"` // e.g. 127.0.0.1:8081; "" = no admin API; default ""
	Token  string `yaml:"token"`  // bearer token it requires; required with listen
}

// admissionConfig is length-aware admission: per pool, requests wait at
// the router while every replica is saturated, shortest expected work
// first with aging, and are shed (429) when they can't be served in time.
type admissionConfig struct {
	Disabled         bool             `yaml:"disabled"`           // admit everything at once (--admission off); default false
	MaxQueueRequests int              `yaml:"max_queue_requests"` // requests that may wait per pool; default 1024
	MaxQueueTokens   int64            `yaml:"max_queue_tokens"`   // their total estimated tokens; default 4194304
	AgingBound       time.Duration    `yaml:"aging_bound"`        // after this wait a request is served in arrival order; default 5s
	Classes          int              `yaml:"classes"`            // priority classes (X-Gpurouter-Priority 0..classes-1); default 4
	TenantQueueShare float64          `yaml:"tenant_queue_share"` // max fraction of the queue one tenant may hold, 0 = no cap; default 0
	TenantFairness   bool             `yaml:"tenant_fairness"`    // share admissions between tenants by tokens; default false
	DefaultTimeout   time.Duration    `yaml:"default_timeout"`    // deadline of requests without X-Gpurouter-Timeout, 0 = none; default 0
	ExpireQueued     bool             `yaml:"expire_queued"`      // also refuse a queued request when its deadline passes; default false
	MaxInFlight      int              `yaml:"max_in_flight"`      // admitted requests per pool, 0 = no cap; default 0
	Saturation       saturationConfig `yaml:"saturation"`
}

// saturationConfig says when a replica can take no more without queueing.
type saturationConfig struct {
	MaxWaiting        int     `yaml:"max_waiting"`         // engine waiting requests tolerated, -1 = ignore; default 0
	KVUsageThreshold  float64 `yaml:"kv_usage_threshold"`  // KV usage (0–1) that saturates while the capacity is unknown (then: the prompt must fit in the free KV), -1 = ignore; default 0.9
	TokenBudgetRatio  float64 `yaml:"token_budget_ratio"`  // the router's requests' fullest KV (balancer/kvpeak.go) + the request's ≤ ratio × KV capacity, -1 = none; default 1
	LongPrefillTokens int     `yaml:"long_prefill_tokens"` // prompt tokens that make a long prefill, 0 = by long_prefill_time, -1 = no cap; default 0
	// LongPrefillTime: a prompt whose prefill takes this long at the
	// pool's fastest learned rate is a long prefill; default 1s.
	LongPrefillTime time.Duration `yaml:"long_prefill_time"`
	MaxLongPrefills int           `yaml:"max_long_prefills"` // concurrent long prefills per replica; default 1
	ShortLanes      int           `yaml:"short_lanes"`       // replicas kept free of long prefills, -1 = none; default 1
	// MaxPrefillWait: the router's queued prefill on a replica, in time at
	// its learned rate, that saturates it; negative = ignore; default 1s.
	MaxPrefillWait time.Duration `yaml:"max_prefill_wait"`
	// MaxITLShare: a replica streaming at this share of a request's TPOT
	// objective or slower has no room for it; negative = ignore; default 0.85.
	MaxITLShare float64 `yaml:"max_itl_share"`
}

// routingConfig tunes how load-based policies score replicas.
type routingConfig struct {
	WaitingWeight      float64 `yaml:"waiting_weight"`       // one waiting request counts as this many running; default 4
	KVThreshold        float64 `yaml:"kv_threshold"`         // KV-cache usage (0–1) above which a replica is penalised; default 0.9
	KVPenalty          float64 `yaml:"kv_penalty"`           // load added at 100% KV usage, in requests; default 8
	PrefillWeight      float64 `yaml:"prefill_weight"`       // prompt token cost relative to an output token; default 0.25
	BoundedLoadEpsilon float64 `yaml:"bounded_load_epsilon"` // affinity policies, LoRA adapter placement: max load (1+ε)× mean; default 0.25
	NearEqual          float64 `yaml:"near_equal"`           // least_loaded, predictive: random among replicas within this many requests of the best; default 0 (off)
}

type logConfig struct {
	Level  string `yaml:"level"`  // debug|info|warn|error; default info
	Format string `yaml:"format"` // json|console; default json
}

type timeoutsConfig struct {
	Connect   time.Duration `yaml:"connect"`    // TCP connect to a replica; default 2s
	FirstByte time.Duration `yaml:"first_byte"` // request sent → first response byte (engine queue + prefill); default 120s
	Idle      time.Duration `yaml:"idle"`       // max gap between two stream events, and max time one write of a response to its client may block; default 60s
	Total     time.Duration `yaml:"total"`      // whole request, 0 = unlimited; default 0
}

type limitsConfig struct {
	MaxBodyBytes   int           `yaml:"max_body_bytes"`   // request body limit; default 8388608 (8 MiB)
	MaxHeaderBytes int           `yaml:"max_header_bytes"` // request line + headers, more is 431; default 16384
	ReadTimeout    time.Duration `yaml:"read_timeout"`     // a client must send its whole request within this (slowloris); default 60s
	MaxConnections int           `yaml:"max_connections"`  // concurrent client connections, more are refused (503); default 10000
}

type retryConfig struct {
	MaxAttempts int           `yaml:"max_attempts"` // tries per request incl. the first; default 3
	BackoffBase time.Duration `yaml:"backoff_base"` // first backoff, doubled per retry, full jitter; default 10ms
	BackoffMax  time.Duration `yaml:"backoff_max"`  // backoff cap; default 200ms
}

type upstreamConfig struct {
	MaxConnsPerReplica int           `yaml:"max_conns_per_replica"` // concurrent connections (= streams) per replica; default 1024
	MaxIdleConnTime    time.Duration `yaml:"max_idle_conn_time"`    // keep-alive idle; below uvicorn's 5s; default 4s
	MaxHeaderBytes     int           `yaml:"max_header_bytes"`      // an engine's response line + headers, more is 502; default 1024
	GoroutineStreams   bool          `yaml:"goroutine_streams"`     // relay each stream on its own goroutine, not in the stream loop; default false
	StreamLoops        int           `yaml:"stream_loops"`          // stream loops sharing the streams; default 0: one per four of GOMAXPROCS, at least one
	GoroutineRequests  bool          `yaml:"goroutine_requests"`    // serve every request on fasthttp's goroutines, without request loops; default false
	RequestLoops       int           `yaml:"request_loops"`         // request loops serving API requests and relaying their streams (Linux); default 0: one per two of GOMAXPROCS, at least one
	UnbatchedIO        bool          `yaml:"unbatched_io"`          // a system call for each socket read and write of the loops, none batched through io_uring; default false
}

type healthConfig struct {
	Path               string        `yaml:"path"`                // default /health
	Interval           time.Duration `yaml:"interval"`            // default 2s
	Timeout            time.Duration `yaml:"timeout"`             // default 1s
	UnhealthyThreshold int           `yaml:"unhealthy_threshold"` // consecutive failures before marking down; default 2
	HealthyThreshold   int           `yaml:"healthy_threshold"`   // consecutive successes before marking up; default 1
	// BusyGrace: a probe that times out within this long of the replica's
	// last relayed token or completed response is inconclusive, not a
	// failure. 0 = interval × unhealthy_threshold + timeout; negative = off.
	BusyGrace time.Duration `yaml:"busy_grace"`
}

type breakerConfig struct {
	ConsecutiveFailures int           `yaml:"consecutive_failures"` // failures in a row that open the breaker; default 5
	OpenTimeout         time.Duration `yaml:"open_timeout"`         // open → half-open; default 10s
	HalfOpenRequests    int           `yaml:"half_open_requests"`   // probes allowed while half-open; default 1
	// MaxEjectionPercent caps the share of a pool's replicas whose breakers
	// may be open at once (one may always be); 100 = no cap; default 50.
	MaxEjectionPercent float64 `yaml:"max_ejection_percent"`
}

type shutdownConfig struct {
	DrainTimeout time.Duration `yaml:"drain_timeout"` // wait for in-flight streams on SIGTERM; default 30s
}

type poolConfig struct {
	Model      string          `yaml:"model"`       // served model name; required, unique across pools incl. aliases
	Aliases    []string        `yaml:"aliases"`     // other names routed to this pool
	PathPrefix string          `yaml:"path_prefix"` // optional route, e.g. /v1/chat/tinyllama; requests under it need no model field
	Policy     string          `yaml:"policy"`      // a balancer policy name; default predictive
	Arms       []armConfig     `yaml:"arms"`        // optional A/B experiment; replaces policy when set
	Replicas   []replicaConfig `yaml:"replicas"`    // at least one, unless discovery sets them
	// Roles lists replicas by their role in prefill/decode disaggregation
	// instead of (or besides) role: on each replica; read into replicas.
	Roles *rolesConfig `yaml:"roles,omitempty"`
	// Split is how a pool with prefill replicas splits long prompts.
	Split splitConfig `yaml:"split"`
	// Discovery finds the replicas instead (DNS or Kubernetes); nil means
	// the replicas list.
	Discovery *discoveryConfig `yaml:"discovery,omitempty"`

	// MaxTokensLimit caps the output tokens a request may ask for: a larger
	// (or absent) max_tokens / max_completion_tokens is rewritten to it;
	// 0 = no cap; default 0.
	MaxTokensLimit int `yaml:"max_tokens_limit"`

	// Engine is which engine serves the pool, for its load metrics:
	// vllm | sglang | llamacpp | tgi | none (not scraped: routed on the
	// router's own counts); default auto (detected from /metrics).
	Engine string `yaml:"engine"`

	Migration migrationConfig `yaml:"migration"`

	PrefixCache prefixCacheConfig `yaml:"prefix_cache"`
	KVEvents    kvEventsConfig    `yaml:"kv_events"`
	LoRA        loraConfig        `yaml:"lora"`
}

// prefixCacheConfig is a pool's prefix-cache index: what the router knows
// of each engine's cached prompt blocks, so that a prompt goes where its
// prefix is cached (predictive, prefix_affinity).
type prefixCacheConfig struct {
	// Mode: approximate (the router's own placements, keyed by the
	// prompt's text) | events (the engines' KV-cache events, kv_events) |
	// off; default approximate.
	Mode      string `yaml:"mode"`
	BlockSize int    `yaml:"block_size"` // events: the engines' KV block size in tokens (vLLM --block-size); default 0: the one they report in vllm:cache_config_info, 16 until then
	// Tokenizer (events) is what the prompt is tokenized with: an
	// embedded vocabulary, cl100k_base|o200k_base (chat rendered as the
	// simulator renders it), or a value ending in .json, the path of the
	// served model's Hugging Face tokenizer.json (byte-level BPE; chat
	// rendered as its ChatML or Llama 3 tokens say); default cl100k_base.
	Tokenizer string `yaml:"tokenizer"`
}

// kvEventsConfig is where a pool's engines publish KV-cache events (vLLM
// --kv-events-config); both of vLLM's encodings are read.
type kvEventsConfig struct {
	// Endpoint is the PUB socket, a template filled per replica:
	// {host} its host, {port} its HTTP port, {port+N} that plus N;
	// e.g. tcp://{host}:5557. Required with prefix_cache.mode events.
	Endpoint       string `yaml:"endpoint"`
	ReplayEndpoint string `yaml:"replay_endpoint"` // the replay socket, same template; "" = none (a gap drops the replica's entries); default ""
	Topic          string `yaml:"topic"`           // subscription prefix; "" = every topic; default ""
}

// loraConfig is how a pool serves LoRA adapters of its model: requests
// naming an adapter are routed to the pool, and placed where the adapter
// runs or sits in a GPU slot.
type loraConfig struct {
	// Adapters are adapter names routed to the pool before any replica
	// lists them (its /v1/models, or its metrics), each name or
	// name=path as vLLM's --lora-modules: path is where the adapter's
	// weights live as the engines read them (lora_path), which
	// load_on_demand needs; default none.
	Adapters []string `yaml:"adapters"`
	// Aware places a request for an adapter where the adapter runs or
	// sits in a slot, then where a slot is free, before a replica that
	// must evict one — within the load bound; false places it as a
	// request for the base model. Default true.
	Aware *bool `yaml:"aware"`
	// ModelsInterval is how often each replica's /v1/models is read for
	// the adapters it serves (with telemetry on, engine vllm or auto);
	// negative = never. Default 10s.
	ModelsInterval time.Duration `yaml:"models_interval"`
	// LoadOnDemand: a request for an adapter placed on a replica that
	// does not serve it has the router load it there first, through
	// vLLM's runtime API (POST /v1/load_lora_adapter; the engine needs
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True). Every adapter needs its
	// path (adapters: name=path). Default false.
	LoadOnDemand bool `yaml:"load_on_demand"`
	// LoadTimeout bounds one load; default 30s.
	LoadTimeout time.Duration `yaml:"load_timeout"`
	// LoadBackoff: a replica whose load of an adapter failed is not asked
	// to load it again for this long; requests meanwhile go to another
	// replica or get 503 at once. Default 30s.
	LoadBackoff time.Duration `yaml:"load_backoff"`
}

// migrationConfig continues a pool's streams on another replica when
// theirs dies (or is drained) mid-stream: same id, no text lost or
// repeated, one usage chunk with the true totals.
type migrationConfig struct {
	// Max is how many times one request may move; 0 = off (a replica
	// failing mid-stream ends its streams with an error event);
	// --migration-limit overrides it for every pool. Default 1.
	Max *int `yaml:"max"`
	// MaxSeqLen: streams longer than this (prompt + output, tokens) are
	// not continued, which bounds what each stream keeps; default 32768.
	MaxSeqLen int `yaml:"max_seq_len"`
	// DrainGrace: a stream still running on a replica that is draining or
	// was removed from the pool moves after this; negative = never (it
	// finishes where it is); default 20s.
	DrainGrace time.Duration `yaml:"drain_grace"`
}

// armConfig is one arm of a pool's A/B experiment.
type armConfig struct {
	Name   string  `yaml:"name"`   // label in metrics and the X-Gpurouter-Policy header; required, unique
	Policy string  `yaml:"policy"` // a balancer policy name; required
	Share  float64 `yaml:"share"`  // traffic share (> 0), normalised over the arms; default 1
}

type replicaConfig struct {
	URL    string     `yaml:"url"`    // http://host:port of a vLLM server; required
	Name   string     `yaml:"name"`   // label in metrics/logs; default host:port
	Weight float64    `yaml:"weight"` // relative capacity; default 1
	GPU    *gpuConfig `yaml:"gpu"`    // optional binding for GPU telemetry
	// Role in prefill/decode disaggregation, as the replica's vLLM
	// --kv-transfer-config kv_role: prefill (kv_producer), decode
	// (kv_consumer), both (kv_both); default none: colocated, never sent
	// a prompt another replica prefilled.
	Role string `yaml:"role,omitempty"`
}

// rolesConfig lists a pool's replicas by role (replicaConfig.Role).
type rolesConfig struct {
	Prefill []replicaConfig `yaml:"prefill"`
	Decode  []replicaConfig `yaml:"decode"`
	Both    []replicaConfig `yaml:"both"`
}

// splitConfig is how a pool with prefill replicas splits a request: a
// prefill replica computes the prompt, a decode replica reads its KV cache
// and streams the answer. Shorter prompts are served colocated, on any
// replica.
type splitConfig struct {
	PrefillPolicy      string `yaml:"prefill_policy"`       // picks the prefill replica (policy picks the decode one); default predictive
	MinPromptTokens    int    `yaml:"min_prompt_tokens"`    // prompts shorter than this (estimated tokens) are served colocated; default 4096
	PrefillsPerReplica int    `yaml:"prefills_per_replica"` // under admission, prefills in flight per prefill replica before the rest wait at the router; default 2
}

// gpuConfig binds a replica to its GPU(s). Exactly one of Index, UUID
// (local NVML), AgentURL (+UUID) or DCGMURL (+Label) is expected; the
// telemetry issue gives them behaviour.
type gpuConfig struct {
	Index    *int   `yaml:"index"`
	UUID     string `yaml:"uuid"`
	AgentURL string `yaml:"agent_url"`
	DCGMURL  string `yaml:"dcgm_url"`
	Label    string `yaml:"label"`
}
