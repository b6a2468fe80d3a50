#!/usr/bin/env bash
# gpurouter against HAProxy leastconn (issue 14): one rerunnable matrix.
#
# The fleet: 4 simulated llama3-8b-a10 replicas (`gpurouter sim`), the last at
# half speed, started fresh for every run. Workloads:
#   conv85    the first $CONV_PROMPTS rows of the Azure conversation trace at
#             its own arrival times, time-scaled to ~85% of the fleet's capacity
#   conv130   the same rows compressed to ~1.3x capacity
#   burst     synthetic, prefill-heavy and bursty: prompts 1-8k tokens
#             (4500 +-78%), outputs 10-60 (35 +-78%), gamma arrivals with
#             burstiness $BURSTINESS (bursts well above capacity, lulls between)
#             at a mean $BURST_RATE req/s (~85% of capacity)
# Configurations per workload: round_robin; HAProxy 2.6 `balance leastconn`
# (bench/scripts/haproxy.cfg); the router's default (no --policy flag); the
# default with --admission off. Every client request carries its SLOs as
# X-Gpurouter-Slo-Ttft/-Tpot headers (HAProxy and round_robin ignore them);
# goodput is judged on the same SLOs.
#
# Capacity (req/s of a full-speed replica, from `gpurouter sim predict` at
# saturation: 1.37 for the trace's lengths, 0.78 for the burst's) times 3.5
# replica-equivalents: ~4.8 req/s for the trace, ~2.7 for the burst.
#
# It prints one table: per run P50/P99 TTFT, P99 TPOT, goodput, throughput,
# failures, the engines' preemptions (KV cache overcommitted), every
# replica's share of requests (counted by the engines) beside
# its share of the capacity the router measured, and the router's TTFT
# predictor |error| P50/P90; then the issue's acceptance ratios.
#
# With REPS=N every run is repeated N times (fresh fleet each time, reps
# interleaved: rep 1 of every configuration, then rep 2, ...): the table
# lists every run, and the ratios are judged on the medians of the reps,
# with how many paired reps (rep i against rep i) pass each on its own. One
# run of a bursty workload is noisy: HAProxy's conv85 goodput spans
# 2.00-2.30 over eight runs of the same trace.
#
#   bench/scripts/vs-haproxy.sh                 # the whole matrix (~25 min)
#   WORKLOADS=burst CONFIGS="haproxy default" bench/scripts/vs-haproxy.sh
#   SERVE_CONFIG=mine.yaml CONFIGS=default bench/scripts/vs-haproxy.sh  # the router with other settings
#   REPS=3 WORKLOADS=conv85 CONFIGS="haproxy default" bench/scripts/vs-haproxy.sh  # ~13 min
#
# Needs haproxy (apt-get install -y haproxy) and python3. Everything runs on
# loopback; every process it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

TRACE=${TRACE:-../shared/data/azure-llm-2023-conv.csv}
WORKLOADS=${WORKLOADS:-conv85 conv130 burst}
CONFIGS=${CONFIGS:-round_robin haproxy default default_admission_off}
CONV_PROMPTS=${CONV_PROMPTS:-350}
CONV85_SCALE=${CONV85_SCALE:-1.09}   # 3.76 req/s (the rows' own rate) x 1.09 = 4.1 req/s
CONV130_SCALE=${CONV130_SCALE:-1.66} # 6.2 req/s
CONV_SLO_TTFT=${CONV_SLO_TTFT:-2000} # ms
CONV_SLO_TPOT=${CONV_SLO_TPOT:-100}  # ms
BURST_PROMPTS=${BURST_PROMPTS:-220}
BURST_RATE=${BURST_RATE:-2.3}
BURSTINESS=${BURSTINESS:-0.15}
BURST_SLO_TTFT=${BURST_SLO_TTFT:-6000}
BURST_SLO_TPOT=${BURST_SLO_TPOT:-250}
PROFILE=${PROFILE:-llama3-8b-a10}
SPEEDS=${SPEEDS:-1,1,1,0.5}
BASE_PORT=${BASE_PORT:-23401} # replicas; the router or HAProxy on BASE_PORT+100
SEED=${SEED:-1}
BIN=${BIN:-}                  # a gpurouter binary; built from this tree when empty
OUT=${OUT:-}                  # keep every run's output here (default: a temp dir, removed)
SERVE_CONFIG=${SERVE_CONFIG:-} # YAML for the router's runs, without pools (e.g. admission settings to try)
REPS=${REPS:-1}               # runs per configuration; the ratios use their medians

command -v haproxy >/dev/null || { echo "haproxy not found (apt-get install -y haproxy)"; exit 2; }
[ -f "$TRACE" ] || { echo "trace $TRACE not found (TRACE=path)"; exit 2; }
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

IFS=, read -r -a speeds <<<"$SPEEDS"
nrep=${#speeds[@]}
replicas=""
engine_flags=()
for i in $(seq 0 $((nrep - 1))); do
  replicas+="${replicas:+,}http://127.0.0.1:$((BASE_PORT + i))"
  engine_flags+=(--engine-url "http://127.0.0.1:$((BASE_PORT + i))")
done
fport=$((BASE_PORT + 100))

wait_up() { # URL: poll until it answers 200, at most 20 s
  for _ in $(seq 200); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "$1 did not come up"; exit 1
}

port_free() { # PORT: nothing may answer there, or the run would measure someone else's server
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "port $1 is in use: pick another BASE_PORT"; exit 1
  fi
}

start_fleet() {
  for i in $(seq 0 $((nrep - 1))) 100; do port_free $((BASE_PORT + i)); done
  "$bin" sim --replicas "$nrep" --base-port "$BASE_PORT" --profile "$PROFILE" --speed "$SPEEDS" \
    --served-model-name m --seed "$SEED" >"$out/$1.sim.log" 2>&1 &
  pids+=($!)
  for i in $(seq 0 $((nrep - 1))); do wait_up "http://127.0.0.1:$((BASE_PORT + i))/health"; done
}

start_front() { # CONFIG RUN
  case $1 in
  haproxy)
    sed -e "s/LISTEN_PORT/$fport/" $(for i in $(seq 0 $((nrep - 1))); do echo "-e s/REPLICA_PORT_$i\b/$((BASE_PORT + i))/"; done) \
      bench/scripts/haproxy.cfg >"$work/haproxy.cfg"
    haproxy -f "$work/haproxy.cfg" -db >"$out/$2.front.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 200); do curl -fsS -o /dev/null "http://127.0.0.1:$fport/v1/models" 2>/dev/null && break; sleep 0.1; done
    return ;;
  round_robin) flags=(--policy round_robin) ;;
  default) flags=() ;;
  default_admission_off) flags=(--admission off) ;;
  *) echo "unknown config $1"; exit 2 ;;
  esac
  if [ -n "$SERVE_CONFIG" ]; then # the file, plus this fleet as pool m
    { cat "$SERVE_CONFIG"; echo "pools:"; echo "  - model: m"
      [ "$1" = round_robin ] && echo "    policy: round_robin"
      echo "    replicas:"; for u in ${replicas//,/ }; do echo "      - url: $u"; done; } >"$work/serve.yaml"
    [ "$1" = default_admission_off ] && flags=(--admission off) || flags=()
    flags+=(--config "$work/serve.yaml")
  else
    flags+=(--pool "m=$replicas")
  fi
  "$bin" serve --listen "127.0.0.1:$fport" "${flags[@]}" >"$out/$2.front.log" 2>&1 &
  pids+=($!)
  wait_up "http://127.0.0.1:$fport/ready"
}

# engine_counts RUN: each replica's finished requests, from its own metrics
# (RUN.counts), and its preemptions (RUN.preemptions): a router placing
# more than the KV cache holds shows there.
engine_counts() {
  : >"$out/$1.counts"
  : >"$out/$1.preemptions"
  for i in $(seq 0 $((nrep - 1))); do
    curl -fsS "http://127.0.0.1:$((BASE_PORT + i))/metrics" >"$work/metrics"
    awk '/^vllm:request_success_total/ {s += $NF} END {printf "%d ", s}' "$work/metrics" >>"$out/$1.counts"
    awk '/^vllm:num_preemptions_total/ {s += $NF} END {printf "%d ", s}' "$work/metrics" >>"$out/$1.preemptions"
  done
}

workload_flags() {
  case $1 in
  conv85 | conv130)
    scale=$CONV85_SCALE
    [ "$1" = conv130 ] && scale=$CONV130_SCALE
    wl=(--dataset-name azure-trace --dataset-path "$TRACE" --num-prompts "$CONV_PROMPTS" --time-scale "$scale")
    slo_ttft=$CONV_SLO_TTFT slo_tpot=$CONV_SLO_TPOT ;;
  burst)
    wl=(--dataset-name random --random-input-len 4500 --random-output-len 35 --random-range-ratio 0.78 --ignore-eos
      --num-prompts "$BURST_PROMPTS" --request-rate "$BURST_RATE" --burstiness "$BURSTINESS")
    slo_ttft=$BURST_SLO_TTFT slo_tpot=$BURST_SLO_TPOT ;;
  *) echo "unknown workload $1"; exit 2 ;;
  esac
}

echo "fleet: $nrep x $PROFILE, speeds $SPEEDS; fresh for every run; results in $out"
for w in $WORKLOADS; do
  workload_flags "$w"
  for rep in $(seq 1 "$REPS"); do for c in $CONFIGS; do
    run=$w.$c
    [ "$rep" = 1 ] || run=$w.$c.r$rep
    echo "$(date -u +%H:%M:%S) $run" >&2
    start_fleet "$run"
    start_front "$c" "$run"
    "$bin" bench --base-url "http://127.0.0.1:$fport" --model m --backend openai "${wl[@]}" --seed "$SEED" \
      --disable-tqdm --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
      --goodput "ttft:$slo_ttft tpot:$slo_tpot" --request-timeout 600s "${engine_flags[@]}" \
      --header "X-Gpurouter-Slo-Ttft=${slo_ttft}ms" --header "X-Gpurouter-Slo-Tpot=${slo_tpot}ms" \
      --save-result --result-dir "$out" --result-filename "$run.json" >"$out/$run.txt" 2>&1 ||
      { cat "$out/$run.txt"; exit 1; }
    engine_counts "$run"
    stop_all
  done; done
done

python3 - "$out" "$WORKLOADS" "$CONFIGS" "$SPEEDS" "$BASE_PORT" "$REPS" <<'EOF'
import json, os, statistics, sys
out, workloads, configs, speeds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split(",")
base_port, reps = int(sys.argv[5]), int(sys.argv[6])
print()
hdr = f"{'workload':8} {'config':22} {'P50 TTFT':>9} {'P99 TTFT':>9} {'P99 TPOT':>9} {'goodput':>8} {'req/s':>6} {'fail':>5} {'preempt':>7}  {'share of requests (engines) / of capacity (router-measured)':60} {'pred |err| P50/P90':>19}"
print(hdr); print("-" * len(hdr))
res = {}  # (workload, config) -> one dict per rep that ran
for w in workloads:
    for c, rep in ((c, rep) for c in configs for rep in range(1, reps + 1)):
        run = f"{w}.{c}" + (f".r{rep}" if rep > 1 else "")
        try:
            j = json.load(open(os.path.join(out, run + ".json")))
        except OSError:
            continue
        counts = [int(x) for x in open(os.path.join(out, run + ".counts")).read().split()]
        n = sum(counts) or 1
        try:  # the engines' preemptions: KV cache overcommitted
            pre = str(sum(int(x) for x in open(os.path.join(out, run + ".preemptions")).read().split()))
        except OSError:
            pre = "-"
        caps = {}
        for r in j.get("gpurouter_replicas") or []:
            if r.get("capacity_share") is not None:
                caps[r["replica"]] = r["capacity_share"]
        shares = []
        for i, k in enumerate(counts):
            cap = caps.get(f"127.0.0.1:{base_port + i}")
            shares.append(f"{k / n * 100:.0f}%" + (f"/{cap * 100:.0f}%" if cap is not None else ""))
        pe = j.get("gpurouter_predictor_ttft_abs_error_ms")
        pes = f"{pe['p50']:.0f}/{pe['p90']:.0f} ms" if pe else "-"
        g = j.get("request_goodput") or 0
        res.setdefault((w, c), []).append(dict(p99=j["p99_ttft_ms"], tpot=j["p99_tpot_ms"], good=g, shares=[k / n for k in counts],
                           in_slo=round(g * j["duration"]), total=len(j["ttfts"]), dur=j["duration"]))
        label = c + (f" #{rep}" if reps > 1 else "")
        print(f"{w:8} {label:22} {j['median_ttft_ms']/1000:8.2f}s {j['p99_ttft_ms']/1000:8.2f}s {j['p99_tpot_ms']:7.0f}ms {g:8.2f} {j['request_throughput']:6.2f} {j['failed']:5d} {pre:>7}  {' '.join(shares):60} {pes:>19}")
print()
sp = [float(s) for s in speeds]
cap_share = [s / sum(sp) for s in sp]

def med(runs):
    # Each figure's median over the reps (shares replica by replica).
    m = {k: statistics.median(r[k] for r in runs) for k in ("p99", "tpot", "good", "in_slo", "total", "dur")}
    m["shares"] = [statistics.median(r["shares"][i] for r in runs) for i in range(len(runs[0]["shares"]))]
    return m

def vs_haproxy(d, h):
    r1 = h["p99"] / d["p99"] if d["p99"] else float("inf")
    r2 = d["good"] / h["good"] if h["good"] else float("inf")
    return r1, r2

def admission_worse(d, off):
    worse = []
    if d["p99"] > off["p99"] * 1.05: worse.append(f"P99 TTFT {d['p99']/off['p99']:.2f}x")
    if d["tpot"] > off["tpot"] * 1.05: worse.append(f"P99 TPOT {d['tpot']/off['tpot']:.2f}x")
    if d["good"] < off["good"] * 0.95: worse.append(f"goodput {d['good']/off['good']:.2f}x")
    return worse

def max_dev(d):
    return max(abs(s / c - 1) for s, c in zip(d["shares"], cap_share))

def paired(a, b, ok):
    # "k of n paired reps pass": rep i against rep i, when REPS > 1.
    if reps == 1 or not a or not b:
        return ""
    n = min(len(a), len(b))
    return f"; {sum(ok(a[i], b[i]) for i in range(n))} of {n} paired reps pass"

of = " (medians of the reps)" if reps > 1 else ""
for w in workloads:
    D, H, OFF = res.get((w, "default")), res.get((w, "haproxy")), res.get((w, "default_admission_off"))
    d, h, off = (med(x) if x else None for x in (D, H, OFF))
    if d and h:
        r1, r2 = vs_haproxy(d, h)
        print(f"{w}: default vs HAProxy{of}: P99 TTFT {r1:.2f}x lower (want >= 1.5: {'ok' if r1 >= 1.5 else 'MISS'}{paired(D, H, lambda a, b: vs_haproxy(a, b)[0] >= 1.5)}),"
              f" goodput {r2:.2f}x (want >= 1.3: {'ok' if r2 >= 1.3 else 'MISS'}{paired(D, H, lambda a, b: vs_haproxy(a, b)[1] >= 1.3)})")
        # The goodput ratio if the default served every request within the
        # SLO in HAProxy's run time: what in-SLO counts alone can give; only
        # a run that ends sooner than HAProxy's can go past it.
        ceil = h["total"] / h["in_slo"] if h["in_slo"] else float("inf")
        print(f"{w}:   within the SLO: default {d['in_slo']:.0f}/{d['total']:.0f} in {d['dur']:.0f} s, HAProxy {h['in_slo']:.0f}/{h['total']:.0f} in {h['dur']:.0f} s;"
              f" all {h['total']:.0f} in {h['dur']:.0f} s would be {ceil:.2f}x HAProxy's goodput")
    if d and off:
        worse = admission_worse(d, off)
        print(f"{w}: admission on vs off: {'never worse (5% tolerance): ok' if not worse else 'worse: ' + ', '.join(worse)}{paired(D, OFF, lambda a, b: not admission_worse(a, b))}")
    if d:
        print(f"{w}: default's request shares vs nominal capacity shares ({', '.join(f'{c*100:.0f}%' for c in cap_share)}): max deviation {max_dev(d)*100:.0f}%"
              f" (want <= 30%: {'ok' if max_dev(d) <= 0.3 else 'MISS'}{'' if reps == 1 else f'; {sum(max_dev(x) <= 0.3 for x in D)} of {len(D)} reps pass'})")
EOF
