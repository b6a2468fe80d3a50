#!/usr/bin/env bash
# A simulated LoRA fleet for issue 53's acceptance run: $REPLICAS replicas of
# $PROFILE serving $ADAPTERS LoRA adapters (lora-0 ... lora-N, the order of
# their popularity) with --enable-lora --max-loras $MAX_LORAS, on
# 127.0.0.1:$BASE_PORT.... It runs in the foreground until Ctrl-C (every
# process it started is stopped on exit), after printing:
#   - the fleet's capacity for this workload, from `gpurouter sim predict`
#     (one replica at saturation seeing every adapter, as under a router
#     blind to adapters), and the request rate that is $LOAD of it;
#   - the commands for the two fronts on port $BASE_PORT+100 (the router,
#     and HAProxy 2.6 `balance leastconn` from bench/scripts/haproxy.cfg);
#   - the bench command: $ADAPTERS adapters by Zipf($ZIPF), random prompts
#     $IN_LEN +-50% tokens, outputs $OUT_LEN +-50%, Poisson arrivals at that
#     rate, every replica's /metrics read for KV use and LoRA swaps.
# Run the bench once per front (restart this script between runs, so that
# every run starts from the same adapters in the same slots).
#
#   bench/scripts/lora-fleet.sh
#   MAX_CPU_LORAS=32 LOAD=1.3 bench/scripts/lora-fleet.sh
#
# max_cpu_loras defaults to vLLM's default, max_loras: an adapter out of its
# GPU slot is then out of the CPU cache too, and comes back from disk
# (~65 ms on these profiles, against ~2 ms from the CPU cache; see
# sim.LoRACosts). The replicas start as vLLM does with --lora-modules: the
# last adapters listed (the least popular) hold the slots.
set -euo pipefail
cd "$(dirname "$0")/../.."

REPLICAS=${REPLICAS:-4}
PROFILE=${PROFILE:-qwen2.5-7b}
BASE_PORT=${BASE_PORT:-24901} # replicas; the front on BASE_PORT+100
ADAPTERS=${ADAPTERS:-32}
ZIPF=${ZIPF:-1.0}
MAX_LORAS=${MAX_LORAS:-4}
MAX_CPU_LORAS=${MAX_CPU_LORAS:-$MAX_LORAS}
LOAD=${LOAD:-0.85}       # of the predicted capacity
IN_LEN=${IN_LEN:-1024}   # prompt tokens, +-50%
OUT_LEN=${OUT_LEN:-128}  # output tokens, +-50%
PROMPTS=${PROMPTS:-1200} # requests per bench run
SEED=${SEED:-1}
BIN=${BIN:-} # a gpurouter binary; built from this tree when empty

work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"' EXIT
bin=${BIN:-$work/gpurouter}
[ -n "$BIN" ] || go build -o "$bin" ./cmd/gpurouter

names=()
modules=()
for i in $(seq 0 $((ADAPTERS - 1))); do
  names+=("lora-$i")
  modules+=("lora-$i=/adapters/lora-$i")
done
lora=(--enable-lora --max-loras "$MAX_LORAS" --max-cpu-loras "$MAX_CPU_LORAS")

for i in $(seq 0 $((REPLICAS - 1))) 100; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$((BASE_PORT + i))") 2>/dev/null; then
    echo "port $((BASE_PORT + i)) is in use: pick another BASE_PORT"; exit 1
  fi
done

# Capacity: one replica at saturation (every request at once) on this
# workload, in virtual time; the fleet has REPLICAS of them.
per=$("$bin" sim predict --profile "$PROFILE" "${lora[@]}" --lora-adapters "$ADAPTERS" --lora-zipf "$ZIPF" \
  --num-prompts 1000 --random-input-len "$IN_LEN" --random-output-len "$OUT_LEN" --random-range-ratio 0.5 --seed "$SEED" |
  awk '/^Request throughput/ {print $NF}')
rate=$(awk -v p="$per" -v n="$REPLICAS" -v l="$LOAD" 'BEGIN {printf "%.2f", p * n * l}')

"$bin" sim --replicas "$REPLICAS" --base-port "$BASE_PORT" --profile "$PROFILE" --served-model-name m --seed "$SEED" \
  "${lora[@]}" --lora-modules "${modules[@]}" >"$work/sim.log" 2>&1 &
pids+=($!)
for i in $(seq 0 $((REPLICAS - 1))); do
  for _ in $(seq 200); do curl -fsS -o /dev/null "http://127.0.0.1:$((BASE_PORT + i))/health" 2>/dev/null && break; sleep 0.1; done
done
cat "$work/sim.log"

replicas="" engines=() haproxy_sed=()
for i in $(seq 0 $((REPLICAS - 1))); do
  replicas+="${replicas:+,}http://127.0.0.1:$((BASE_PORT + i))"
  engines+=(--engine-url "http://127.0.0.1:$((BASE_PORT + i))")
  haproxy_sed+=(-e "s/REPLICA_PORT_$i\\b/$((BASE_PORT + i))/")
done
front=$((BASE_PORT + 100))
cat <<EOF

capacity: $per req/s per replica ($PROFILE, $ADAPTERS adapters Zipf($ZIPF), max_loras $MAX_LORAS, max_cpu_loras $MAX_CPU_LORAS)
          x $REPLICAS replicas x $LOAD = $rate req/s

front, one of:
  $bin serve --listen 127.0.0.1:$front --pool m=$replicas
  sed -e s/LISTEN_PORT/$front/ ${haproxy_sed[*]} bench/scripts/haproxy.cfg >/tmp/haproxy-lora.cfg && haproxy -f /tmp/haproxy-lora.cfg -db
    (haproxy.cfg lists 4 replicas: with REPLICAS != 4, edit its server lines)

bench:
  $bin bench --base-url http://127.0.0.1:$front --model m --dataset-name random \\
    --random-input-len $IN_LEN --random-output-len $OUT_LEN --random-range-ratio 0.5 --ignore-eos \\
    --num-prompts $PROMPTS --request-rate $rate --seed $SEED --lora-modules ${names[*]} --lora-zipf $ZIPF \\
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 ${engines[*]} \\
    --save-result --result-filename lora-FRONT.json

the fleet runs until Ctrl-C
EOF
wait "${pids[0]}"
