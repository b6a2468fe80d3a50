// Package sim simulates vLLM replicas: vLLM's OpenAI-compatible HTTP API,
// errors, streaming shapes and Prometheus metrics in front of an engine model
// that batches continuously as vLLM V1 does (FCFS waiting queue,
// max_num_seqs, a per-step token budget with chunked prefill, a KV cache in
// blocks with prefix caching, preemption by recompute, abort on disconnect)
// and times every step with a roofline of the GPU. It is an instrument for
// testing routers and admission control, so its timing is calibrated against
// published measurements (Calibrate, `gpurouter sim calibrate`) and it
// reports its own timing error (gpurouter_sim_step_lag_seconds).
//
// # Time
//
// The engine core never reads a clock: the scheduler decides a step and
// returns its modelled duration, and a driver advances time. Replica.Run and
// Fleet.Run drive it in real time behind HTTP; Simulate drives it in virtual
// time, fast and deterministic, for calibration, property tests and what-if
// sweeps over engine arguments (`gpurouter sim predict`).
//
// # In-process fleets
//
// Tests of other packages start replicas on ephemeral loopback ports and stop
// them by cancelling the context:
//
//	p, _ := sim.Builtin("qwen2.5-7b")
//	f, _ := sim.NewFleet(sim.FleetConfig{Replicas: 2, Profiles: []sim.Profile{p}})
//	_ = f.Listen()                    // binds 127.0.0.1 ports
//	go f.Run(ctx)                     // returns once everything has stopped
//	urls := f.URLs()                  // http://127.0.0.1:PORT, one per replica
//	f.Replicas()[1].SetFaults(sim.Faults{ErrorRate: 0.2})
//
// Build one tokens.Estimator and pass it in FleetConfig.Estimator when
// starting many fleets: loading the vocabulary is the slow part of NewFleet.
// fasthttp's worker-pool cleaner outlives a stopped server by up to a second.
//
// # HTTP surface of a replica
//
//	POST /v1/chat/completions, /v1/completions   streaming (SSE) and not; n=1 only
//	GET  /v1/models, /health, /version, /load, /ping
//	POST /tokenize                                {"count": N, ...}
//	GET  /metrics                                 vLLM V1 names, labels and buckets
//	GET  /v1/gpus                                 gpu.HostReport, as `gpurouter agent` serves
//	GET|POST /sim/faults                          the Faults document (exempt from faults)
//	POST /v1/load_lora_adapter, /v1/unload_lora_adapter   with AllowRuntimeLoRAUpdating only, as vLLM
//	POST /sim/kv_transfer/pull (side channel port)  with a KV connector: a decode replica's KV read
//
// Generated text is a walk through a small vocabulary fixed by the request's
// seed and the last word (or token id) of its context, so a continuation —
// vLLM's continue_final_message on chat, the prompt plus the text or the
// token ids generated so far on completions — produces exactly the words an
// uninterrupted run would have (text.go). return_token_ids returns the
// prompt's and every chunk's token ids as vLLM 0.10.2+ does.
//
// # LoRA
//
// With enable_lora (--enable-lora, --max-loras, --max-cpu-loras,
// --max-lora-rank) a replica serves LoRA adapters as vLLM does: adapters
// come from ReplicaConfig.LoRAModules (--lora-modules name=path or JSON) or
// at run time from POST /v1/load_lora_adapter; /v1/models lists them with
// their parent; a request names its adapter as its model (and is answered
// under that name). vLLM's V1 scheduler skips a waiting request whose
// adapter would make the step's distinct adapters exceed max_loras, and the
// worker keeps adapters in max_loras GPU slots and max_cpu_loras CPU cache
// entries, both LRU: a step that needs an adapter outside the slots pays
// for the swap (from the CPU cache, or from disk), and every step pays a
// little per distinct adapter in it (LoRACosts has the numbers and their
// sources). The slots take their memory from the KV cache. Metrics:
// vLLM's vllm:lora_requests_info (a gauge whose value is the time it was
// set; read the newest series) and the simulator's
// gpurouter_sim_lora_swaps_total{source="cpu"|"disk"}. Without
// enable_lora nothing of this exists and nothing changes.
//
// # Prefill/decode disaggregation
//
// With a KV connector (ReplicaConfig.KVTransfer, `gpurouter sim
// --kv-transfer-role prefill|decode|both` or vLLM's --kv-transfer-config
// JSON) a replica takes part in a split as vLLM's NixlConnector does
// (kvtransfer.go has the protocol and its sources): a request with
// kv_transfer_params {"do_remote_decode": true} and max_tokens 1 is
// prefilled, its blocks held and their whereabouts returned as the
// response's kv_transfer_params; a request carrying those (do_remote_prefill)
// parks, counted as waiting, while its replica reads the blocks from the
// prefill replica's side channel (its own port, VLLM_NIXL_SIDE_CHANNEL_PORT's
// 5600 by default, plain HTTP), then computes only the prompt's last token
// and streams. The read takes the KV bytes (whole blocks × block_size ×
// the profile's KV bytes per token) over the slower end's bandwidth
// (--kv-transfer-bandwidth, 50 GB/s: one 400 Gb/s RDMA port), a prefill
// replica frees held blocks nobody read after 480 s
// (VLLM_NIXL_ABORT_REQUEST_TIMEOUT), and a read that fails is recomputed
// (or fails the request: kv_load_failure_policy "fail"). Metrics: vLLM's
// vllm:nixl_* and the simulator's gpurouter_sim_kv_transfer_*. A replica
// without a connector ignores kv_transfer_params, as vLLM does, and nothing
// of this exists on it.
//
// # Faults
//
// Faults (GET|POST /sim/faults, SetFaults, `gpurouter sim --faults JSON`)
// imitate what real upstreams do to a router. Besides errors, hangs, a dead
// engine, lying health, stale metrics and slow or throttled GPUs, five
// families concern connections, admission, LoRA loads and KV reads, each with a flag of
// `gpurouter sim` as well:
//
//   - close_after_response (--close-after-response): llama.cpp's
//     llama-server, which sends "Keep-Alive: timeout=5, max=100" and no
//     "Connection: close", then closes the connection after every response,
//     streamed or not; close_lag_seconds (--close-lag) holds each one open,
//     unread, that long first, as a FIN crossing a network arrives late.
//     keepalive_timeout_seconds (--timeout-keep-alive, 5 by default, as
//     uvicorn's) closes idle keep-alive connections.
//   - max_waiting_queue_length (--max-waiting-queue-length, as vLLM's): a
//     request reaching the engine while N wait is refused with 429,
//     Retry-After (retry_after_seconds, --retry-after) and vLLM's error
//     document, type RateLimitError. rate_limited (--rate-limited) refuses
//     every inference request so.
//   - crash_seconds: dies now, as kill -9 does to a client: the listener
//     goes first (connects are refused), then every connection, idle
//     pooled ones included, is reset; it listens again after the downtime.
//     crash_every_seconds and crash_down_seconds (--crash-every,
//     --crash-down) make it die again and again, for soaks.
//   - lora_load_refuse and lora_load_delay_seconds (--lora-load-refuse,
//     --lora-load-delay): POST /v1/load_lora_adapter fails as a load the
//     engine could not do, or answers late, as a load from a slow store.
//   - kv_transfer_stall, kv_transfer_crash_seconds, kv_transfer_fail_rate
//     (--kv-transfer-stall, --kv-transfer-crash, --kv-transfer-fail-rate):
//     a prefill replica whose KV reads never finish, that dies half-way
//     through each, or that refuses them.
//
// # Simplifications
//
// Generated text is one filler word per token. Prompt tokens are counted with
// the benchmark's BPE counter (bench/tokens), and prefix-cache blocks are
// hashed over words rather than token ids. No speculative decoding,
// logprobs or n>1. Every LoRA adapter has rank max_lora_rank (the simulator
// reads no adapter_config.json). vllm:cache_config_info also carries model_name (vLLM's has
// only engine) so that every vllm:* series has both labels. Counters survive
// a simulated crash (a real restart resets them).
package sim
