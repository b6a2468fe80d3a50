package sim

import (
	"flag"
	"time"
)

// FaultFlags carries the faults that have flags of their own (the
// connection, refusal and crash faults) from a command line to a Faults
// document. Flags that were not given leave their field alone, so they
// combine with a --faults JSON document, and win over it.
type FaultFlags struct {
	fs          *flag.FlagSet
	closeAfter  *bool
	closeLag    *time.Duration
	keepAlive   *float64
	maxWaiting  *int
	rateLimited *bool
	retryAfter  *int
	crashEvery  *time.Duration
	crashDown   *time.Duration
	kvDrop      *float64
	kvLose      *float64
	kvReorder   *float64
	loraRefuse  *bool
	loraDelay   *time.Duration
	kvStall     *bool
	kvCrash     *time.Duration
	kvFail      *float64
}

// RegisterFaultFlags defines the fault flags on fs. The vLLM and uvicorn
// ones keep those servers' names.
func RegisterFaultFlags(fs *flag.FlagSet) *FaultFlags {
	return &FaultFlags{
		fs: fs,
		closeAfter: fs.Bool("close-after-response", false,
			"close the connection after every response while advertising keep-alive (Keep-Alive: timeout=5, max=100, no Connection: close), as llama.cpp's llama-server does (fault close_after_response)"),
		closeLag: fs.Duration("close-lag", 0,
			"with --close-after-response: hold the connection open, unread, this long after the response before closing it, as an engine's FIN reaches a router across a network a round trip late (fault close_lag_seconds)"),
		keepAlive: fs.Float64("timeout-keep-alive", defaultKeepAliveTimeout.Seconds(),
			"seconds an idle keep-alive connection stays open before the server closes it, as uvicorn's --timeout-keep-alive (fault keepalive_timeout_seconds)"),
		maxWaiting: fs.Int("max-waiting-queue-length", 0,
			"refuse a request with 429 + Retry-After when this many wait in the engine's queue, as vLLM's --max-waiting-queue-length; 0 = unlimited (fault max_waiting_queue_length)"),
		rateLimited: fs.Bool("rate-limited", false,
			"refuse every inference request with 429 + Retry-After, whatever the load (fault rate_limited)"),
		retryAfter: fs.Int("retry-after", 1,
			"Retry-After seconds of the 429s (0 = 1); -1 = no Retry-After header (fault retry_after_seconds)"),
		crashEvery: fs.Duration("crash-every", 0,
			"crash (as kill -9: connects refused, connections reset) this long after start and after each restart; 0 = never (fault crash_every_seconds)"),
		crashDown: fs.Duration("crash-down", time.Second,
			"how long each crash of --crash-every lasts before the replica listens again (fault crash_down_seconds)"),
		kvDrop: fs.Float64("kv-events-drop-rate", 0,
			"fraction of KV event batches not sent but kept for replay: a subscriber sees the gap and replays (fault kv_events_drop_rate)"),
		kvLose: fs.Float64("kv-events-lose-rate", 0,
			"fraction of KV event batches lost for good, from the replay buffer too: a subscriber must resync (fault kv_events_lose_rate)"),
		kvReorder: fs.Float64("kv-events-reorder-rate", 0,
			"fraction of KV event batches sent after the next one (fault kv_events_reorder_rate)"),
		loraRefuse: fs.Bool("lora-load-refuse", false,
			"fail every POST /v1/load_lora_adapter as a load the engine could not do, 400 BadRequestError (fault lora_load_refuse)"),
		loraDelay: fs.Duration("lora-load-delay", 0,
			"answer every POST /v1/load_lora_adapter this much later, as a load from a slow store (fault lora_load_delay_seconds)"),
		kvStall: fs.Bool("kv-transfer-stall", false,
			"a prefill replica posts every KV read and never finishes it: the decode replica's read times out (fault kv_transfer_stall)"),
		kvCrash: fs.Duration("kv-transfer-crash", 0,
			"a prefill replica dies half-way through every KV read it serves, down this long (fault kv_transfer_crash_seconds)"),
		kvFail: fs.Float64("kv-transfer-fail-rate", 0,
			"fraction of KV reads a prefill replica refuses at once, as a failed NIXL transfer (fault kv_transfer_fail_rate)"),
	}
}

// Apply sets on f the fields of the fault flags that were given.
func (ff *FaultFlags) Apply(f *Faults) {
	ff.fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "close-after-response":
			f.CloseAfterResponse = *ff.closeAfter
		case "close-lag":
			f.CloseLagSeconds = ff.closeLag.Seconds()
		case "timeout-keep-alive":
			f.KeepAliveTimeoutSeconds = *ff.keepAlive
		case "max-waiting-queue-length":
			f.MaxWaitingQueueLength = *ff.maxWaiting
		case "rate-limited":
			f.RateLimited = *ff.rateLimited
		case "retry-after":
			f.RetryAfterSeconds = *ff.retryAfter
		case "crash-every":
			f.CrashEverySeconds = ff.crashEvery.Seconds()
		case "crash-down":
			f.CrashDownSeconds = ff.crashDown.Seconds()
		case "kv-events-drop-rate":
			f.KVEventsDropRate = *ff.kvDrop
		case "kv-events-lose-rate":
			f.KVEventsLoseRate = *ff.kvLose
		case "kv-events-reorder-rate":
			f.KVEventsReorderRate = *ff.kvReorder
		case "lora-load-refuse":
			f.LoRALoadRefuse = *ff.loraRefuse
		case "lora-load-delay":
			f.LoRALoadDelaySeconds = ff.loraDelay.Seconds()
		case "kv-transfer-stall":
			f.KVTransferStall = *ff.kvStall
		case "kv-transfer-crash":
			f.KVTransferCrashSeconds = ff.kvCrash.Seconds()
		case "kv-transfer-fail-rate":
			f.KVTransferFailRate = *ff.kvFail
		}
	})
}
