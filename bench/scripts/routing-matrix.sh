#!/usr/bin/env bash
# The routing-quality matrix (issue 50): what any change to routing or
# admission runs before it lands. One command, one table.
#
# Every run starts a fresh simulated fleet (`gpurouter sim`, 4 replicas) and
# puts one configuration in front of it: round_robin (or another policy by
# its name: least_loaded, prefix_affinity, least_tokens, kv_aware, p2c,
# least_request, random; each with the router's admission on); HAProxy 2.6
# `balance leastconn` (bench/scripts/haproxy.cfg); the router's default (no --policy);
# the default with --admission off; default_events, the default with its
# prefix index fed by the engines' KV-cache events (the sims publish them,
# `--kv-events-endpoint`, PUB on BASE_PORT+50+i and replay on
# BASE_PORT+60+i; the router reads them, prefix_cache.mode events) where
# the default's index is approximate (fed by its own placements). Fleets: even (speeds 1,1,1,1) and uneven
# (1,1,1,0.5). Workloads, each at ~85% and ~130% of what the fleet sustains
# behind HAProxy (see "Rates" below):
#   conv85 conv130  the first $CONV_PROMPTS rows of the Azure conversation
#                   trace, time-scaled (llama3-8b-a10 replicas)
#   burst           synthetic, prefill-heavy, gamma arrivals (burstiness
#                   $BURSTINESS): prompts 1-8k, outputs 10-60, mean ~85%
#                   (llama3-8b-a10)
#   mooncake85 mooncake130
#                   the first $MOONCAKE_PROMPTS rows of a Mooncake trace
#                   (bench --dataset-name mooncake: one 512-token block of
#                   text per hash id, so prompts share prefixes as the trace
#                   says), time-scaled, on qwen3.5-9b-h100 replicas with
#                   --max-model-len 131072 (longer rows are dropped, as vLLM
#                   refuses them). MOONCAKE=FILE takes any trace of that
#                   format (e.g. the FAST'25 conversation or tool/agent one);
#                   its rows come at their own rate, so set MOONCAKE85_SCALE_*
#                   and MOONCAKE130_SCALE_* for it (the defaults are the
#                   synthetic trace's). The first 800 rows of the synthetic
#                   trace repeat 14.6% of their blocks (the whole trace 64%:
#                   its conversations come back later).
#   long85 long130  long context: prompts 8k-32k tokens, outputs 100-800,
#                   Poisson arrivals (qwen3.5-9b-h100, as mooncake)
#   chat85 chat130  long multi-turn chat (bench/scripts/chat-trace.py, a
#                   Mooncake-format trace made for the run): prompts mean
#                   ~13k tokens, median ~7k, a few past 80k, outputs ~340,
#                   one shared system block, a quarter of the conversations
#                   coming back with their history (27% of the blocks
#                   repeat) — the shape of a production chat trace the
#                   project does not have (qwen3.5-9b-h100, as mooncake)
# SLOs (sent as X-Gpurouter-Slo-Ttft/-Tpot headers, which HAProxy and
# round_robin ignore, unless SLO_HEADERS=0: a client that sends none, as
# a new user's does; goodput is judged on them either way): conv TTFT 2 s / TPOT 100 ms,
# burst 6 s / 250 ms, mooncake and long 2 s / 100 ms. Prompts go to
# /v1/completions: the prompt is the text as is, so a Mooncake prompt is
# exactly input_length tokens and its 512-token blocks start on engine block
# boundaries (a chat template adds its own tokens around it).
#
# Rates: 85% and 130% of what the fleet sustains behind HAProxy, in
# req/s. conv and burst keep issue 14's settings on the uneven fleet (3.5
# replica-equivalents x the saturated throughput of one replica from
# `gpurouter sim predict`: 1.37 req/s for the trace's lengths, 0.78 for the
# burst's) and take 8/7 of them on the even fleet (4 equivalents).
# mooncake and long were measured behind HAProxy (2026-12-07, this 2-core
# box, busy; runs of 400-800 requests):
#   mooncake, first 800 rows (3.62 req/s at time scale 1): offered ~1.2x,
#     HAProxy completed 8.6 req/s (uneven; 799 requests in 93 s) and 10.1
#     (even; 79 s); `sim predict` with the rows' lengths: 2.45 req/s a
#     replica, 8.6 and 9.8. At 85% (time scale 2.0 and 2.4) HAProxy keeps
#     up: the runs end 7 s and 5 s after the last arrival, P50 TTFT 0.7 s
#     and not growing. 130%: 11.2 and 13.1 req/s, time scale 3.1 and 3.6.
#   long: `sim predict` at saturation, 1.43 req/s a replica: 5.0 (uneven)
#     and 5.7 (even). Behind HAProxy at 4.3 and 5.3 req/s (Poisson: 4.6
#     and 5.7 offered while measured) the runs end 12 s and 10 s after the
#     last arrival, P50 TTFT ~1.0 s and nearly flat, the half-speed replica
#     getting 14% (its capacity share): it keeps up at ~92-100% of the
#     prediction. (At 6.2 and 7.0 it falls behind, completing 3.6 and 5.3
#     req/s, the slow replica then holding 19% of the requests.) 85%: 4.25
#     and 4.85 req/s; 130%: 6.5 and 7.4.
# Each run takes 1.5-2.5 min; one rep of the whole matrix (56 runs) about
# 1 h 45 min.
#
# The table: per run P50/P90/P99 TTFT, P99 TPOT, goodput, failures, the
# engines' preemptions, their prefix-cache hit rate over the run (hits /
# queried tokens; for mooncake beside the ideal: one shared unbounded
# cache), the router's index beside them (pred%: the tokens it predicted
# cached where it sent them; gave%: the tokens another replica held
# beyond that, given up for load or an objective), mean KV-cache use (each replica read every second, averaged), and
# each replica's share of requests (counted by the engines) beside its
# share of capacity (its speed). Then per row (workload x fleet) the
# verdicts against HAProxy, on the medians of the reps: default goodput
# >= 1.1x HAProxy's and default P50 TTFT <= HAProxy's; on conv85, conv130
# and burst on the uneven fleet (issue 14) also P99 TTFT >= 1.5x lower and
# goodput >= 1.3x; admission on vs off never worse by more than 5% (P50 and
# P99 TTFT, P99 TPOT, goodput); no replica's request share over 1.5x its
# capacity share. It writes every run's medians to $SUMMARY (JSON); with
# BASELINE=an earlier summary it prints each run's change against it and
# flags the router's runs that got worse by more than 5%. With OUT, each
# router run's own metrics at its end stay in RUN.router.metrics (why
# admission held requests: gpurouter_admission_held_total{reason}). Exit status 1
# when a verdict misses or a router run got worse than the baseline.
#
#   bench/scripts/routing-matrix.sh                     # everything: 14 rows x 4 configs
#   WORKLOADS=mooncake85 FLEETS=uneven CONFIGS="haproxy default" MOONCAKE_PROMPTS=60 bench/scripts/routing-matrix.sh
#   REPS=3 OUT=/tmp/m1 bench/scripts/routing-matrix.sh  # medians of 3; keeps every run's files
#   BASELINE=/tmp/m1/summary.json bench/scripts/routing-matrix.sh
#   SERVE_CONFIG=mine.yaml CONFIGS="haproxy default" bench/scripts/routing-matrix.sh
#   ROUTERS=4 WORKLOADS=mooncake85 CONFIGS=default_events bench/scripts/routing-matrix.sh
#
# Knobs: WORKLOADS, FLEETS, CONFIGS, REPS, {CONV,BURST,MOONCAKE,LONG}_PROMPTS,
# the rates above, BIN (a gpurouter binary; built from this tree when
# empty), OUT (keep every run's output there; default a temp dir, removed),
# SUMMARY (default $OUT/summary.json, or ./routing-matrix-summary.json
# without OUT), BASELINE, SERVE_CONFIG (YAML for the router's runs, without
# pools), BASE_PORT, SEED, ROUTERS (that many routers, alike and sharing
# no state, on each router run's fleet, bench spreading the requests over
# them round robin; each one's metrics in RUN.router[K].metrics; the
# router-side figures pred% and gave% are the first router's). OUT,
# SUMMARY, BASELINE and SERVE_CONFIG are relative to where it is started;
# TRACE and MOONCAKE to the repository.
# Needs haproxy (apt-get install -y haproxy) and python3; everything runs
# on loopback, and every process it starts is stopped on exit.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/../.."
abspath() { case $1 in /*) echo "$1" ;; "") echo "" ;; *) echo "$here/$1" ;; esac; }

TRACE=${TRACE:-../shared/data/azure-llm-2023-conv.csv}
MOONCAKE=${MOONCAKE:-../shared/data/mooncake-synthetic.jsonl}
WORKLOADS=${WORKLOADS:-conv85 conv130 burst mooncake85 mooncake130 long85 long130 chat85 chat130}
FLEETS=${FLEETS:-even uneven}
CONFIGS=${CONFIGS:-round_robin haproxy default default_admission_off}
REPS=${REPS:-1}
CONV_PROMPTS=${CONV_PROMPTS:-350}
BURST_PROMPTS=${BURST_PROMPTS:-220}
MOONCAKE_PROMPTS=${MOONCAKE_PROMPTS:-800}
LONG_PROMPTS=${LONG_PROMPTS:-400}
CHAT_PROMPTS=${CHAT_PROMPTS:-1000}
SLO_HEADERS=${SLO_HEADERS:-1}
# conv: the 350 rows' own rate is 3.76 req/s; x1.09 = 4.1 req/s (85% of
# 3.5 x 1.37), x1.66 = 6.2 (130%); 8/7 of that on the even fleet.
CONV85_SCALE_UNEVEN=${CONV85_SCALE_UNEVEN:-1.09} CONV85_SCALE_EVEN=${CONV85_SCALE_EVEN:-1.25}
CONV130_SCALE_UNEVEN=${CONV130_SCALE_UNEVEN:-1.66} CONV130_SCALE_EVEN=${CONV130_SCALE_EVEN:-1.90}
BURST_RATE_UNEVEN=${BURST_RATE_UNEVEN:-2.3} BURST_RATE_EVEN=${BURST_RATE_EVEN:-2.63}
BURSTINESS=${BURSTINESS:-0.15}
# mooncake and long: see "Rates" above.
MOONCAKE85_SCALE_UNEVEN=${MOONCAKE85_SCALE_UNEVEN:-2.0} MOONCAKE85_SCALE_EVEN=${MOONCAKE85_SCALE_EVEN:-2.4}
MOONCAKE130_SCALE_UNEVEN=${MOONCAKE130_SCALE_UNEVEN:-3.1} MOONCAKE130_SCALE_EVEN=${MOONCAKE130_SCALE_EVEN:-3.6}
LONG85_RATE_UNEVEN=${LONG85_RATE_UNEVEN:-4.25} LONG85_RATE_EVEN=${LONG85_RATE_EVEN:-4.85}
LONG130_RATE_UNEVEN=${LONG130_RATE_UNEVEN:-6.5} LONG130_RATE_EVEN=${LONG130_RATE_EVEN:-7.4}
# chat: the trace is made at 7.4 req/s; CHAT*_SCALE compress it.
CHAT85_SCALE_UNEVEN=${CHAT85_SCALE_UNEVEN:-0.85} CHAT85_SCALE_EVEN=${CHAT85_SCALE_EVEN:-1.0}
CHAT130_SCALE_UNEVEN=${CHAT130_SCALE_UNEVEN:-1.3} CHAT130_SCALE_EVEN=${CHAT130_SCALE_EVEN:-1.5}
SHORT_PROFILE=${SHORT_PROFILE:-llama3-8b-a10}
LONG_PROFILE=${LONG_PROFILE:-qwen3.5-9b-h100}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-131072} # the long-prompt fleet's, and bench's drop bound
BASE_PORT=${BASE_PORT:-23501} # replicas; the router or HAProxy on BASE_PORT+100
ROUTERS=${ROUTERS:-1} # router processes on one fleet (BASE_PORT+100, +101, ...); HAProxy is one
SEED=${SEED:-1}
BIN=${BIN:-}
OUT=$(abspath "${OUT:-}")
SUMMARY=$(abspath "${SUMMARY:-}")
BASELINE=$(abspath "${BASELINE:-}")
SERVE_CONFIG=$(abspath "${SERVE_CONFIG:-}")

command -v haproxy >/dev/null || { echo "haproxy not found (apt-get install -y haproxy)"; exit 2; }
command -v python3 >/dev/null || { echo "python3 not found"; exit 2; }
for w in $WORKLOADS; do
  case $w in
  conv*) [ -f "$TRACE" ] || { echo "trace $TRACE not found (TRACE=path)"; exit 2; } ;;
  mooncake*) [ -f "$MOONCAKE" ] || { echo "trace $MOONCAKE not found (MOONCAKE=path)"; exit 2; } ;;
  esac
done
[ -z "$BASELINE" ] || [ -f "$BASELINE" ] || { echo "baseline $BASELINE not found"; exit 2; }
work=$(mktemp -d)
out=${OUT:-$work/out}
mkdir -p "$out"
[ -n "$SUMMARY" ] || SUMMARY=${OUT:+$out/summary.json}
[ -n "$SUMMARY" ] || SUMMARY=$here/routing-matrix-summary.json
bin=${BIN:-$work/gpurouter}
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT
[ -n "$BIN" ] || go build -o "$bin" ./cmd/gpurouter

nrep=4
fport=$((BASE_PORT + 100))
replicas=""
engine_flags=()
for i in $(seq 0 $((nrep - 1))); do
  replicas+="${replicas:+,}http://127.0.0.1:$((BASE_PORT + i))"
  engine_flags+=(--engine-url "http://127.0.0.1:$((BASE_PORT + i))")
done

speeds_of() { case $1 in even) echo 1,1,1,1 ;; uneven) echo 1,1,1,0.5 ;; *) echo "unknown fleet $1"; exit 2 ;; esac; }

wait_up() { # URL: poll until it answers 200, at most 20 s
  for _ in $(seq 200); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "$1 did not come up"; exit 1
}

port_free() { # PORT: nothing may answer there, or the run would measure someone else's server
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "port $1 is in use: pick another BASE_PORT"; exit 1
  fi
}

start_fleet() { # RUN PROFILE SPEEDS [SIM FLAGS...]
  local run=$1 profile=$2 speeds=$3
  shift 3
  for i in $(seq 0 $((nrep - 1))) $(seq 100 $((99 + ROUTERS))); do port_free $((BASE_PORT + i)); done
  local kv=()
  if [ "${run##*.}" = default_events ]; then
    for i in $(seq 0 $((nrep - 1))); do port_free $((BASE_PORT + 50 + i)); port_free $((BASE_PORT + 60 + i)); done
    kv=(--kv-events-endpoint "tcp://127.0.0.1:$((BASE_PORT + 50))" --kv-events-replay-endpoint "tcp://127.0.0.1:$((BASE_PORT + 60))")
  fi
  "$bin" sim --replicas "$nrep" --base-port "$BASE_PORT" --profile "$profile" --speed "$speeds" \
    --served-model-name m --seed "$SEED" "${kv[@]}" "$@" >"$out/$run.sim.log" 2>&1 &
  pids+=($!)
  for i in $(seq 0 $((nrep - 1))); do wait_up "http://127.0.0.1:$((BASE_PORT + i))/health"; done
}

start_front() { # CONFIG RUN
  local flags=() policy=
  case $1 in
  haproxy)
    sed -e "s/LISTEN_PORT/$fport/" $(for i in $(seq 0 $((nrep - 1))); do echo "-e s/REPLICA_PORT_$i\b/$((BASE_PORT + i))/"; done) \
      bench/scripts/haproxy.cfg >"$work/haproxy.cfg"
    haproxy -f "$work/haproxy.cfg" -db >"$out/$2.front.log" 2>&1 &
    pids+=($!)
    wait_up "http://127.0.0.1:$fport/v1/models"
    return ;;
  default | default_admission_off | default_events) ;;
  round_robin | least_loaded | least_request | least_tokens | kv_aware | p2c | random | prefix_affinity) policy=$1 ;;
  *) echo "unknown config $1"; exit 2 ;;
  esac
  [ "$1" = default_admission_off ] && flags=(--admission off)
  if [ -n "$SERVE_CONFIG" ] || [ "$1" = default_events ]; then # the file, plus this fleet as pool m
    { [ -z "$SERVE_CONFIG" ] || cat "$SERVE_CONFIG"; echo "pools:"; echo "  - model: m"
      [ -z "$policy" ] || echo "    policy: $policy"
      if [ "$1" = default_events ]; then
        echo "    prefix_cache: {mode: events}"
        echo "    kv_events: {endpoint: \"tcp://{host}:{port+50}\", replay_endpoint: \"tcp://{host}:{port+60}\"}"
      fi
      echo "    replicas:"; for u in ${replicas//,/ }; do echo "      - url: $u"; done; } >"$work/serve.yaml"
    flags+=(--config "$work/serve.yaml")
  else
    [ -z "$policy" ] || flags+=(--policy "$policy")
    flags+=(--pool "m=$replicas")
  fi
  for k in $(seq 0 $((ROUTERS - 1))); do # alike, sharing no state, as replicas of a Deployment
    "$bin" serve --listen "127.0.0.1:$((fport + k))" "${flags[@]}" >"$out/$2.front$([ "$k" = 0 ] || echo "$k").log" 2>&1 &
    pids+=($!)
  done
  for k in $(seq 0 $((ROUTERS - 1))); do wait_up "http://127.0.0.1:$((fport + k))/ready"; done
}

# fronts CONFIG: bench's --base-url flags, one a router (requests spread
# over them round robin, as a Service does); HAProxy is always one.
fronts() {
  local n=$ROUTERS
  [ "$1" != haproxy ] || n=1
  for k in $(seq 0 $((n - 1))); do echo --base-url "http://127.0.0.1:$((fport + k))"; done
}

# engine_counts RUN: each replica's finished requests, from its own metrics
# (RUN.counts; the fleet is fresh, so the totals are the run's), its
# prefix-cache hits and queries (RUN.prefix: bench reads no engine when
# it spreads a run over several routers), and how late the simulator
# ended its steps, as a share of their modelled time (RUN.lag): a busy
# machine shows there, and such a run's timings are not to be trusted.
engine_counts() {
  : >"$out/$1.counts"
  : >"$out/$1.lag"
  : >"$out/$1.prefix"
  for i in $(seq 0 $((nrep - 1))); do
    curl -fsS "http://127.0.0.1:$((BASE_PORT + i))/metrics" >"$work/metrics"
    awk '/^vllm:request_success_total/ {s += $NF} END {printf "%d ", s}' "$work/metrics" >>"$out/$1.counts"
    awk '/^gpurouter_sim_step_lag_seconds_sum/ {l = $NF} /^gpurouter_sim_step_duration_seconds_sum/ {d = $NF}
      END {printf "%.4f ", (d > 0 ? l / d : 0)}' "$work/metrics" >>"$out/$1.lag"
    awk '/^vllm:prefix_cache_hits_total/ {h += $NF} /^vllm:prefix_cache_queries_total/ {q += $NF}
      END {printf "%d %d\n", h, q}' "$work/metrics" >>"$out/$1.prefix"
  done
}

# workload WORKLOAD FLEET: sets wl (bench flags), sim (profile and flags)
# and the SLOs.
workload() {
  local f=${2^^} v
  case $1 in
  conv85 | conv130)
    v=${1^^}_SCALE_$f
    wl=(--dataset-name azure-trace --dataset-path "$TRACE" --num-prompts "$CONV_PROMPTS" --time-scale "${!v}")
    sim=("$SHORT_PROFILE") slo_ttft=2000 slo_tpot=100 ;;
  burst)
    v=BURST_RATE_$f
    wl=(--dataset-name random --random-input-len 4500 --random-output-len 35 --random-range-ratio 0.78 --ignore-eos
      --num-prompts "$BURST_PROMPTS" --request-rate "${!v}" --burstiness "$BURSTINESS")
    sim=("$SHORT_PROFILE") slo_ttft=6000 slo_tpot=250 ;;
  mooncake85 | mooncake130)
    v=${1^^}_SCALE_$f
    wl=(--dataset-name mooncake --dataset-path "$MOONCAKE" --num-prompts "$MOONCAKE_PROMPTS" --time-scale "${!v}"
      --max-model-len "$MAX_MODEL_LEN")
    sim=("$LONG_PROFILE" --max-model-len "$MAX_MODEL_LEN") slo_ttft=2000 slo_tpot=100 ;;
  chat85 | chat130)
    v=${1^^}_SCALE_$f
    [ -f "$work/chat.jsonl" ] || python3 bench/scripts/chat-trace.py --seed "$SEED" --requests "$CHAT_PROMPTS" >"$work/chat.jsonl"
    wl=(--dataset-name mooncake --dataset-path "$work/chat.jsonl" --num-prompts "$CHAT_PROMPTS" --time-scale "${!v}"
      --max-model-len "$MAX_MODEL_LEN")
    sim=("$LONG_PROFILE" --max-model-len "$MAX_MODEL_LEN") slo_ttft=2000 slo_tpot=100 ;;
  long85 | long130)
    v=${1^^}_RATE_$f
    wl=(--dataset-name random --random-input-len 20000 --random-range-ratio 0.6 --random-output-len 450
      --random-output-range-ratio 0.7777 --ignore-eos --num-prompts "$LONG_PROMPTS" --request-rate "${!v}")
    sim=("$LONG_PROFILE" --max-model-len "$MAX_MODEL_LEN") slo_ttft=2000 slo_tpot=100 ;;
  *) echo "unknown workload $1"; exit 2 ;;
  esac
}

echo "fleets: $nrep replicas ($FLEETS), fresh for every run; results in $out"
for w in $WORKLOADS; do for fl in $FLEETS; do
  workload "$w" "$fl"
  speeds=$(speeds_of "$fl")
  for rep in $(seq 1 "$REPS"); do for c in $CONFIGS; do
    run=$w.$fl.$c
    [ "$rep" = 1 ] || run=$run.r$rep
    echo "$(date -u +%H:%M:%S) $run" >&2
    echo "${sim[*]} --speed $speeds | ${wl[*]} | slo ttft:$slo_ttft tpot:$slo_tpot headers:$SLO_HEADERS$([ "$ROUTERS" = 1 ] || [ "$c" = haproxy ] || echo " routers:$ROUTERS")" >"$out/$run.settings"
    start_fleet "$run" "${sim[0]}" "$speeds" "${sim[@]:1}"
    start_front "$c" "$run"
    slo=(--header "X-Gpurouter-Slo-Ttft=${slo_ttft}ms" --header "X-Gpurouter-Slo-Tpot=${slo_tpot}ms")
    [ "$SLO_HEADERS" = 1 ] || slo=()
    # shellcheck disable=SC2046 # fronts: flag pairs without spaces
    "$bin" bench $(fronts "$c") --model m --backend openai "${wl[@]}" --seed "$SEED" \
      --disable-tqdm --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
      --goodput "ttft:$slo_ttft tpot:$slo_tpot" --request-timeout 600s "${engine_flags[@]}" "${slo[@]}" \
      --save-result --result-dir "$out" --result-filename "$run.json" >"$out/$run.txt" 2>&1 ||
      { cat "$out/$run.txt"; exit 1; }
    engine_counts "$run"
    # The router's own metrics at the end of the run: why admission held
    # requests (gpurouter_admission_held_total{reason}), what it shed.
    if [ "$c" != haproxy ]; then
      for k in $(seq 0 $((ROUTERS - 1))); do
        curl -fsS "http://127.0.0.1:$((fport + k))/metrics" >"$out/$run.router$([ "$k" = 0 ] || echo "$k").metrics" 2>/dev/null || true
      done
    fi
    stop_all
  done; done
done; done

python3 bench/scripts/routing-matrix.py --out "$out" --workloads "$WORKLOADS" --fleets "$FLEETS" \
  --configs "$CONFIGS" --reps "$REPS" --summary "$SUMMARY" ${BASELINE:+--baseline "$BASELINE"}
