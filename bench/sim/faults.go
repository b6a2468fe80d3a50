package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/valyala/fasthttp"
)

// Faults are failures a replica imitates, for testing how a router copes.
// They are set at start (ReplicaConfig.Faults, `gpurouter sim --faults`),
// from Go (SetFaults) or over HTTP: POST /sim/faults with this document as
// JSON replaces the whole set (send {} to clear), GET /sim/faults returns
// it. The zero value is a healthy replica.
type Faults struct {
	// ErrorRate is the fraction of inference requests answered with
	// ErrorStatus (an OpenAI-shaped error) before anything is streamed.
	ErrorRate float64 `json:"error_rate,omitempty"`
	// ErrorStatus is the status of those errors: 500, 502 or 503. 0 = 500.
	ErrorStatus int `json:"error_status,omitempty"`
	// Hang accepts inference requests and never answers them (until the
	// client gives up). /health, /metrics still answer, as a wedged engine
	// behind a live API server does.
	Hang bool `json:"hang,omitempty"`
	// HangAll makes every endpoint hang, /health and /metrics included
	// (only /sim/* still answers): a wedged process.
	HangAll bool `json:"hang_all,omitempty"`
	// Dead is vLLM's EngineDeadError: inference requests get 500 and /health
	// 503.
	Dead bool `json:"dead,omitempty"`
	// Health overrides /health: "" tells the truth (200, or 503 when Dead),
	// "ok" always answers 200, "fail" always 503.
	Health string `json:"health,omitempty"`
	// StaleMetricsSeconds serves /metrics as it was this many seconds ago
	// (history is kept for 2 minutes at 1 s resolution).
	StaleMetricsSeconds float64 `json:"stale_metrics_seconds,omitempty"`
	// SlowStartSeconds makes the engine SlowStartFactor times slower for this
	// long after each start or restart (cold caches, compilation). Setting it
	// at runtime starts a slow window now.
	SlowStartSeconds float64 `json:"slow_start_seconds,omitempty"`
	// SlowStartFactor is the slowdown during slow start. 0 = 4.
	SlowStartFactor float64 `json:"slow_start_factor,omitempty"`
	// Speed multiplies the replica's configured speed (0.5 = a degraded
	// replica running at half speed). 0 = unchanged.
	Speed float64 `json:"speed,omitempty"`
	// CrashSeconds, when set in a POST or SetFaults, crashes the replica now
	// and keeps it down that long (see Replica.Crash): as after kill -9, its
	// listener is gone (connects are refused) and every open connection,
	// idle pooled ones included, is reset. A downtime longer than the test
	// keeps it dead. It is an action, not a state: it reads back as 0.
	CrashSeconds float64 `json:"crash_seconds,omitempty"`
	// CrashEverySeconds crashes the replica again and again, this long
	// after the fault is set and after each restart, each time for
	// CrashDownSeconds (0 = 1 s): a replica that keeps dying, for soaks.
	// It needs Serve running. 0 = never.
	CrashEverySeconds float64 `json:"crash_every_seconds,omitempty"`
	CrashDownSeconds  float64 `json:"crash_down_seconds,omitempty"`

	// CloseAfterResponse imitates llama.cpp's llama-server: every response
	// but /sim/*'s, streamed or not, advertises keep-alive
	// ("Keep-Alive: timeout=5, max=100", no "Connection: close"), and then
	// the server closes the connection (FIN) once the response is written.
	// A client that reuses the pooled connection finds it closed.
	CloseAfterResponse bool `json:"close_after_response,omitempty"`
	// CloseLagSeconds delays that close by this long after the response's
	// last byte, the connection held open and unread meanwhile: across a
	// network the engine's FIN reaches the router a round trip or more
	// after the response, and a request the router sends in that window
	// meets a connection that will not answer it (reset at the close, as
	// a socket closed with unread bytes is). On loopback a router that
	// polls quickly sees the FIN before it reuses the connection; this
	// makes it meet the window. 0 = at once.
	CloseLagSeconds float64 `json:"close_lag_seconds,omitempty"`
	// KeepAliveTimeoutSeconds is how long an idle keep-alive connection
	// stays open before the server closes it (FIN), as uvicorn's
	// --timeout-keep-alive, which vLLM's API server runs with.
	// 0 = 5, uvicorn's default. It needs Serve (not Handler).
	KeepAliveTimeoutSeconds float64 `json:"keepalive_timeout_seconds,omitempty"`

	// MaxWaitingQueueLength bounds the engine's waiting queue, as
	// vLLM's --max-waiting-queue-length (vllm-project/vllm#49330): an
	// inference request that reaches the engine while N requests wait is
	// refused with 429 and Retry-After (see RetryAfterSeconds). 0 =
	// unlimited.
	MaxWaitingQueueLength int `json:"max_waiting_queue_length,omitempty"`
	// RateLimited refuses every inference request with 429 and
	// Retry-After, however idle the engine: a replica that turns
	// everything away. /health and /metrics still answer.
	RateLimited bool `json:"rate_limited,omitempty"`
	// RetryAfterSeconds is the Retry-After header of those 429s. 0 = 1;
	// -1 = no Retry-After header.
	RetryAfterSeconds int `json:"retry_after_seconds,omitempty"`
	// KVEventsDropRate is the fraction of KV event batches not sent on the
	// PUB socket but kept for replay: lost on the way, and recoverable (a
	// subscriber sees the gap and replays). KVEventsLoseRate is the
	// fraction lost for good, from the replay buffer too (a subscriber must
	// resync). KVEventsReorderRate is the fraction sent after the batch
	// that follows them. They need KV events on.
	KVEventsDropRate    float64 `json:"kv_events_drop_rate,omitempty"`
	KVEventsLoseRate    float64 `json:"kv_events_lose_rate,omitempty"`
	KVEventsReorderRate float64 `json:"kv_events_reorder_rate,omitempty"`
	// LoRALoadRefuse fails every POST /v1/load_lora_adapter as a load
	// that vLLM's engine could not do (400 BadRequestError);
	// LoRALoadDelaySeconds answers each that much later, as a load from a
	// slow store does. They need AllowRuntimeLoRAUpdating.
	LoRALoadRefuse       bool    `json:"lora_load_refuse,omitempty"`
	LoRALoadDelaySeconds float64 `json:"lora_load_delay_seconds,omitempty"`
	// KVTransferStall makes the side channel of a prefill replica post
	// every read (headers) and then send nothing, as a stalled RDMA
	// transfer: the decode replica's read times out. KVTransferCrashSeconds
	// makes the replica die (as crash_seconds, down this long) half-way
	// through every read it serves: the reader's connection is reset and
	// the held blocks are lost. KVTransferFailRate answers that fraction of
	// reads with an error at once, as a failed NIXL transfer. They need a
	// KV connector.
	KVTransferStall        bool    `json:"kv_transfer_stall,omitempty"`
	KVTransferCrashSeconds float64 `json:"kv_transfer_crash_seconds,omitempty"`
	KVTransferFailRate     float64 `json:"kv_transfer_fail_rate,omitempty"`
	// XidErrors and ThrottleReasons are reported by /v1/gpus; throttling
	// also lowers the reported SM clock. They don't change timing: use
	// Speed for that.
	XidErrors       uint64   `json:"xid_errors,omitempty"`
	ThrottleReasons []string `json:"throttle_reasons,omitempty"`
}

func (f Faults) validate() error {
	var errs []error
	if f.ErrorRate < 0 || f.ErrorRate > 1 {
		errs = append(errs, fmt.Errorf("error_rate %v not in [0,1]", f.ErrorRate))
	}
	switch f.ErrorStatus {
	case 0, 500, 502, 503:
	default:
		errs = append(errs, fmt.Errorf("error_status %d: want 500, 502 or 503", f.ErrorStatus))
	}
	switch f.Health {
	case "", "ok", "fail":
	default:
		errs = append(errs, fmt.Errorf("health %q: want \"\", \"ok\" or \"fail\"", f.Health))
	}
	if f.StaleMetricsSeconds < 0 || f.SlowStartSeconds < 0 || f.SlowStartFactor < 0 || f.Speed < 0 || f.CrashSeconds < 0 ||
		f.CrashEverySeconds < 0 || f.CrashDownSeconds < 0 || f.KeepAliveTimeoutSeconds < 0 || f.MaxWaitingQueueLength < 0 ||
		f.CloseLagSeconds < 0 || f.LoRALoadDelaySeconds < 0 || f.KVTransferCrashSeconds < 0 {
		errs = append(errs, errors.New("durations, factors, speed and lengths must be >= 0"))
	}
	if r := f.KVEventsDropRate + f.KVEventsLoseRate + f.KVEventsReorderRate; f.KVEventsDropRate < 0 ||
		f.KVEventsLoseRate < 0 || f.KVEventsReorderRate < 0 || r > 1 {
		errs = append(errs, fmt.Errorf("kv_events_{drop,lose,reorder}_rate must be >= 0 and sum to at most 1"))
	}
	if f.KVTransferFailRate < 0 || f.KVTransferFailRate > 1 {
		errs = append(errs, fmt.Errorf("kv_transfer_fail_rate %v not in [0,1]", f.KVTransferFailRate))
	}
	if f.RetryAfterSeconds < -1 {
		errs = append(errs, fmt.Errorf("retry_after_seconds %d: want >= 0, or -1 for no header", f.RetryAfterSeconds))
	}
	if f.StaleMetricsSeconds > maxStaleHistory.Seconds() {
		errs = append(errs, fmt.Errorf("stale_metrics_seconds %v > %v", f.StaleMetricsSeconds, maxStaleHistory.Seconds()))
	}
	return errors.Join(errs...)
}

func (f Faults) slowStartFactor() float64 {
	if f.SlowStartFactor <= 0 {
		return 4
	}
	return f.SlowStartFactor
}

func (f Faults) crashDown() time.Duration {
	if f.CrashDownSeconds <= 0 {
		return time.Second
	}
	return secondsDur(f.CrashDownSeconds)
}

// secondsDur converts a fault's seconds to a duration.
func secondsDur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func (f Faults) errorStatus() int {
	if f.ErrorStatus == 0 {
		return fasthttp.StatusInternalServerError
	}
	return f.ErrorStatus
}

// Faults returns the faults in effect.
func (r *Replica) Faults() Faults { return *r.faults.Load() }

// SetFaults replaces the faults in effect. A positive CrashSeconds crashes
// the replica now (see Crash).
func (r *Replica) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return fmt.Errorf("sim: faults: %w", err)
	}
	crash := f.CrashSeconds
	f.CrashSeconds = 0
	old := r.faults.Swap(&f)
	if f.SlowStartSeconds > 0 && (f.SlowStartSeconds != old.SlowStartSeconds || f.SlowStartFactor != old.SlowStartFactor) {
		r.warmStart.Store(time.Now().UnixNano())
	}
	select {
	case r.faultsChanged <- struct{}{}: // Serve reschedules periodic crashes
	default:
	}
	if crash > 0 {
		r.Crash(secondsDur(crash))
	}
	return nil
}

// serveFaults answers GET and POST /sim/faults.
func (inc *incarnation) serveFaults(ctx *fasthttp.RequestCtx) {
	r := inc.r
	switch string(ctx.Method()) {
	case fasthttp.MethodGet:
	case fasthttp.MethodPost, fasthttp.MethodPut:
		var f Faults
		dec := json.NewDecoder(bytes.NewReader(ctx.PostBody()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "invalid faults: "+err.Error())
			return
		}
		if err := f.validate(); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, "BadRequestError", "invalid faults: "+err.Error())
			return
		}
		if f.CrashSeconds > 0 {
			// Crash once this response is on the wire, so the caller hears
			// back before its connection is cut.
			crash := f.CrashSeconds
			f.CrashSeconds = 0
			_ = r.SetFaults(f)
			body, _ := json.Marshal(r.Faults())
			ctx.SetContentType("application/json")
			ctx.SetConnectionClose()
			ctx.SetBodyStream(&afterWrite{data: body, fn: func() { r.Crash(secondsDur(crash)) }}, len(body))
			return
		}
		_ = r.SetFaults(f)
	default:
		writeMethodNotAllowed(ctx)
		return
	}
	body, _ := json.Marshal(r.Faults())
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// afterWrite is a response body that runs fn once it has been written.
type afterWrite struct {
	data []byte
	fn   func()
}

func (a *afterWrite) Read(p []byte) (int, error) {
	if len(a.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, a.data)
	a.data = a.data[n:]
	return n, nil
}

func (a *afterWrite) CloseWithError(error) error {
	if a.fn != nil {
		a.fn()
		a.fn = nil
	}
	return nil
}
