#!/usr/bin/env bash
# Prefill/decode disaggregation against a colocated fleet of the same size
# (issue 54, item 4): 4 simulated H100s serving Qwen3.5-9B ($PROFILE), as
#   colocated  4 replicas, each prefilling and decoding, behind `gpurouter serve`
#   1P+3D      1 prefill replica (`gpurouter sim --kv-transfer-role prefill`) and
#              3 decode replicas (`--kv-transfer-role decode`), two sim processes:
#              every KV read crosses from one process to the other
#   2P+2D      the same, 2 and 2
# under the long-context workload: random prompts $IN_LEN +-$RATIO (8k-32k
# tokens), outputs $OUT_LEN +-$RATIO (200-800), Poisson arrivals at $LOAD of
# what the colocated fleet sustains, computed first with `gpurouter sim
# predict --replicas 4` at saturation (virtual time). Every request carries
# the SLOs (X-Gpurouter-Slo-Ttft/-Tpot) and goodput is judged on them:
# TTFT <= $SLO_TTFT ms and TPOT <= $SLO_TPOT ms.
#
# It prints one table: per configuration, `sim predict`'s prediction at that
# rate and the measured run — P50/P99 TTFT, P99 TPOT, goodput, throughput,
# failures, and for a split the KV reads (count, mean time, failed), from
# the engines' vllm:nixl_* metrics — then each split against colocated.
# Each run's bench output (with the prefill/decode phases of the engines)
# stays in $OUT when given.
#
# The split runs need a router that drives the split: prefill request
# (max_tokens 1, stream false, kv_transfer_params do_remote_decode), then the
# client's request on a decode replica with the prefill response's
# kv_transfer_params (bench/sim/testdata/golden/pd/ has the exact shapes).
# They run through `gpurouter serve --config` with the pool's replicas under
# `roles:` (below; ROUTER_CONFIG adds settings of yours, without pools). A
# router that does not accept that configuration (`serve --check` fails) gets
# its split runs skipped, with the reason; the colocated run and every
# prediction still run.
#
#   bench/scripts/pd-fleet.sh                       # ~3 runs x (PROMPTS / rate) s
#   CONFIGS=colocated PROMPTS=300 bench/scripts/pd-fleet.sh
#   SPLITS="1:3 2:2 3:1" bench/scripts/pd-fleet.sh  # more splits (P:D, P+D = REPLICAS)
#   ROUTER_CONFIG=mine.yaml OUT=/tmp/pd bench/scripts/pd-fleet.sh
#
# Needs python3. Everything runs on loopback; every process it starts is
# stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

PROFILE=${PROFILE:-qwen3.5-9b-h100}
REPLICAS=${REPLICAS:-4}
SPLITS=${SPLITS:-1:3 2:2}          # prefill:decode replicas, each summing to REPLICAS
CONFIGS=${CONFIGS:-colocated split} # colocated and/or split
IN_LEN=${IN_LEN:-19900}             # prompts 7,960-31,840 tokens with RATIO 0.6 (max_model_len 32768)
OUT_LEN=${OUT_LEN:-500}             # outputs 200-800
RATIO=${RATIO:-0.6}
LOAD=${LOAD:-0.85}       # of the colocated fleet's predicted capacity
RATE=${RATE:-}           # req/s; overrides LOAD
PROMPTS=${PROMPTS:-600}  # requests per run
SLO_TTFT=${SLO_TTFT:-2000} # ms
SLO_TPOT=${SLO_TPOT:-50}   # ms
BANDWIDTH=${BANDWIDTH:-50} # GB/s, the KV reads' (sim --kv-transfer-bandwidth)
BASE_PORT=${BASE_PORT:-25301} # replicas; the router on BASE_PORT+100; side channels on BASE_PORT+200...
SEED=${SEED:-1}
BIN=${BIN:-}                   # a gpurouter binary; built from this tree when empty
OUT=${OUT:-}                   # keep every run's output here (default: a temp dir, removed)
ROUTER_CONFIG=${ROUTER_CONFIG:-} # YAML settings for the router's runs, without pools

command -v python3 >/dev/null || { echo "python3 not found"; exit 2; }
work=$(mktemp -d)
out=${OUT:-$work/out}
mkdir -p "$out"
bin=${BIN:-$work/gpurouter}
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT
[ -n "$BIN" ] || go build -o "$bin" ./cmd/gpurouter

wl=(--random-input-len "$IN_LEN" --random-output-len "$OUT_LEN" --random-range-ratio "$RATIO")
fport=$((BASE_PORT + 100))
side=$((BASE_PORT + 200))

wait_up() { # URL: poll until it answers 200, at most 20 s
  for _ in $(seq 200); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "$1 did not come up"; exit 1
}

port_free() { # PORT: nothing may answer there, or the run would measure someone else's server
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "port $1 is in use: pick another BASE_PORT"; exit 1
  fi
}

predict() { # NAME FLAGS...: sim predict's key figures as NAME.predict (JSON)
  local name=$1; shift
  "$bin" sim predict --profile "$PROFILE" "$@" "${wl[@]}" --num-prompts "$PROMPTS" --seed "$SEED" \
    --goodput "ttft:$SLO_TTFT tpot:$SLO_TPOT" >"$out/$name.predict.txt"
  python3 - "$out/$name.predict.txt" >"$out/$name.predict" <<'EOF'
import json, re, sys
v = {}
for line in open(sys.argv[1]):
    m = re.match(r"^(.*?):\s+(\S+)", line)
    if m:
        v[m.group(1)] = m.group(2)
f = lambda k: float(v[k]) if k in v else None
print(json.dumps({"p50_ttft_ms": f("Median TTFT (ms)"), "p99_ttft_ms": f("P99 TTFT (ms)"), "p99_tpot_ms": f("P99 TPOT (ms)"),
                  "goodput": f("Request goodput (req/s)"), "throughput": f("Request throughput (req/s)"),
                  "kv_reads": f("KV reads"), "mean_kv_read_ms": float(v["Mean / P99 KV read (ms)"]) if "Mean / P99 KV read (ms)" in v else None}))
EOF
}

# Capacity: the colocated fleet at saturation (every request at once), in
# virtual time.
cap=$("$bin" sim predict --profile "$PROFILE" --replicas "$REPLICAS" "${wl[@]}" --num-prompts "$PROMPTS" --seed "$SEED" |
  awk '/^Request throughput/ {print $NF}')
rate=${RATE:-$(awk -v c="$cap" -v l="$LOAD" 'BEGIN {printf "%.2f", c * l}')}
echo "capacity: $cap req/s for $REPLICAS colocated $PROFILE (sim predict, saturation); runs at $rate req/s"

# The configurations: colocated, then each split.
runs=()
for c in $CONFIGS; do
  case $c in
  colocated) runs+=(colocated) ;;
  split) for s in $SPLITS; do runs+=("${s%%:*}P+${s##*:}D"); done ;;
  *) echo "unknown config $c"; exit 2 ;;
  esac
done

for run in "${runs[@]}"; do
  if [ "$run" = colocated ]; then
    predict "$run" --replicas "$REPLICAS" --request-rate "$rate"
  else
    np=${run%%P+*} nd=${run##*+}; nd=${nd%D}
    [ $((np + nd)) = "$REPLICAS" ] || { echo "$run: $np + $nd != $REPLICAS replicas"; exit 2; }
    predict "$run" --prefill-replicas "$np" --decode-replicas "$nd" --kv-transfer-bandwidth "$BANDWIDTH" --request-rate "$rate"
  fi
done

# router_config RUN NP ND FILE: the router's configuration for a split, the
# pool's replicas under roles: (ROUTER_CONFIG's settings first).
router_config() {
  local np=$2 nd=$3 i
  {
    [ -n "$ROUTER_CONFIG" ] && cat "$ROUTER_CONFIG"
    echo "pools:"
    echo "  - model: m"
    echo "    roles:"
    echo "      prefill:"
    for i in $(seq 0 $((np - 1))); do echo "        - url: http://127.0.0.1:$((BASE_PORT + i))"; done
    echo "      decode:"
    for i in $(seq "$np" $((np + nd - 1))); do echo "        - url: http://127.0.0.1:$((BASE_PORT + i))"; done
  } >"$4"
}

echo "fleet: $REPLICAS x $PROFILE; fresh for every run; results in $out"
for run in "${runs[@]}"; do
  for i in $(seq 0 $((REPLICAS - 1))) 100; do port_free $((BASE_PORT + i)); done
  engines=()
  if [ "$run" = colocated ]; then
    urls=""
    for i in $(seq 0 $((REPLICAS - 1))); do
      urls+="${urls:+,}http://127.0.0.1:$((BASE_PORT + i))"
      engines+=(--engine-url "http://127.0.0.1:$((BASE_PORT + i))")
    done
    front=(--pool "m=$urls")
    if [ -n "$ROUTER_CONFIG" ]; then # the file, plus this fleet as pool m
      { cat "$ROUTER_CONFIG"; echo "pools:"; echo "  - model: m"; echo "    replicas:"
        for u in ${urls//,/ }; do echo "      - url: $u"; done; } >"$work/serve.yaml"
      front=(--config "$work/serve.yaml")
    fi
  else
    np=${run%%P+*} nd=${run##*+}; nd=${nd%D}
    for i in $(seq 0 $((REPLICAS - 1))); do port_free $((side + i)); done
    router_config "$run" "$np" "$nd" "$work/$run.yaml"
    cp "$work/$run.yaml" "$out/$run.router.yaml"
    if ! "$bin" serve --check --config "$work/$run.yaml" >"$out/$run.check.txt" 2>&1; then
      echo "$(date -u +%H:%M:%S) $run: skipped, the router does not take its configuration (a router that drives a split is issue 54's router side):" >&2
      sed 's/^/    /' "$out/$run.check.txt" | head -5 >&2
      continue
    fi
    for i in $(seq 0 $((np - 1))); do engines+=(--engine-url "prefill=http://127.0.0.1:$((BASE_PORT + i))"); done
    for i in $(seq "$np" $((REPLICAS - 1))); do engines+=(--engine-url "decode=http://127.0.0.1:$((BASE_PORT + i))"); done
    front=(--config "$work/$run.yaml")
  fi
  echo "$(date -u +%H:%M:%S) $run" >&2
  if [ "$run" = colocated ]; then
    "$bin" sim --replicas "$REPLICAS" --base-port "$BASE_PORT" --profile "$PROFILE" --served-model-name m --seed "$SEED" \
      >"$out/$run.sim.log" 2>&1 &
    pids+=($!)
  else
    "$bin" sim --replicas "$np" --base-port "$BASE_PORT" --profile "$PROFILE" --served-model-name m --seed "$SEED" \
      --kv-transfer-role prefill --kv-transfer-side-channel-port "$side" --kv-transfer-bandwidth "$BANDWIDTH" \
      >"$out/$run.prefill.sim.log" 2>&1 &
    pids+=($!)
    "$bin" sim --replicas "$nd" --base-port $((BASE_PORT + np)) --profile "$PROFILE" --served-model-name m --seed $((SEED + 100)) \
      --kv-transfer-role decode --kv-transfer-side-channel-port $((side + np)) --kv-transfer-bandwidth "$BANDWIDTH" \
      >"$out/$run.decode.sim.log" 2>&1 &
    pids+=($!)
  fi
  for i in $(seq 0 $((REPLICAS - 1))); do wait_up "http://127.0.0.1:$((BASE_PORT + i))/health"; done
  "$bin" serve --listen "127.0.0.1:$fport" "${front[@]}" >"$out/$run.router.log" 2>&1 &
  pids+=($!)
  wait_up "http://127.0.0.1:$fport/ready"
  "$bin" bench --base-url "http://127.0.0.1:$fport" --model m --dataset-name random "${wl[@]}" --ignore-eos \
    --num-prompts "$PROMPTS" --request-rate "$rate" --seed "$SEED" --disable-tqdm \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
    --goodput "ttft:$SLO_TTFT tpot:$SLO_TPOT" --request-timeout 900s "${engines[@]}" \
    --header "X-Gpurouter-Slo-Ttft=${SLO_TTFT}ms" --header "X-Gpurouter-Slo-Tpot=${SLO_TPOT}ms" \
    --save-result --result-dir "$out" --result-filename "$run.json" >"$out/$run.txt" 2>&1 ||
    { cat "$out/$run.txt"; exit 1; }
  stop_all
done

python3 - "$out" "$rate" "$SLO_TTFT" "$SLO_TPOT" "${runs[@]}" <<'EOF'
import json, os, sys
out, rate, slo_ttft, slo_tpot, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
print()
print(f"long-context workload at {rate} req/s; goodput: TTFT <= {slo_ttft} ms and TPOT <= {slo_tpot} ms")
hdr = f"{'config':10} {'':9} {'P50 TTFT':>9} {'P99 TTFT':>9} {'P99 TPOT':>9} {'goodput':>8} {'req/s':>6} {'fail':>5} {'KV reads':>9} {'read ms':>8} {'failed':>6}"
print(hdr); print("-" * len(hdr))
def cell(v, fmt):
    width = int(fmt.split(".")[0])
    return format(v, fmt) if v is not None else "-".rjust(width)
measured = {}
for run in runs:
    p = json.load(open(os.path.join(out, run + ".predict")))
    print(f"{run:10} {'predicted':9} {cell(p['p50_ttft_ms'] and p['p50_ttft_ms']/1000, '8.2f')}s {cell(p['p99_ttft_ms'] and p['p99_ttft_ms']/1000, '8.2f')}s"
          f" {cell(p['p99_tpot_ms'], '7.1f')}ms {cell(p['goodput'], '8.2f')} {cell(p['throughput'], '6.2f')} {'-':>5}"
          f" {cell(p['kv_reads'], '9.0f')} {cell(p['mean_kv_read_ms'], '8.1f')} {'-':>6}")
    try:
        j = json.load(open(os.path.join(out, run + ".json")))
    except OSError:
        print(f"{run:10} {'measured':9} not run (see above)")
        continue
    pd = j.get("gpurouter_pd_phases") or {}
    g = j.get("request_goodput") or 0
    measured[run] = dict(tpot=j["p99_tpot_ms"], good=g)
    print(f"{run:10} {'measured':9} {j['median_ttft_ms']/1000:8.2f}s {j['p99_ttft_ms']/1000:8.2f}s {j['p99_tpot_ms']:7.1f}ms {g:8.2f}"
          f" {j['request_throughput']:6.2f} {j['failed']:5d} {cell(pd.get('kv_reads'), '9.0f')} {cell(pd.get('mean_kv_read_ms'), '8.1f')}"
          f" {cell(pd.get('kv_failed_reads'), '6.0f')}")
print()
base = measured.get("colocated")
for run, m in measured.items():
    if run == "colocated" or not base:
        continue
    tp = base["tpot"] / m["tpot"] if m["tpot"] else float("inf")
    gp = m["good"] / base["good"] if base["good"] else float("inf")
    print(f"{run} vs colocated (measured): P99 TPOT {tp:.2f}x lower, goodput {gp:.2f}x")
EOF
