#!/usr/bin/env bash
# Many routers vs one (issue 13): router replicas share no state, so N
# routers in front of one fleet, the client spreading requests over them
# round-robin as a Kubernetes Service would, should serve a workload as well
# as one router does.
#
# The fleet: 4 simulated replicas (`gpurouter sim`), the last at half speed.
# The workload: the first $PROMPTS requests of the Azure conversation trace
# (shared/data/azure-llm-2023-conv.csv), replayed at its own arrival times,
# time-scaled to $LOAD of the fleet's capacity. Capacity is probed first
# (unless CAPACITY is given), as `gpurouter bench sweep` defines it: the
# highest Poisson rate in $PROBE_RATES at which one router meets the SLO at
# P99 ($PROBE_PROMPTS requests of the trace's lengths per rate).
#
# Then it runs 1 router, $ROUTERS routers, 1, $ROUTERS ... ($ROUNDS rounds, so
# a drift of the machine's load does not favour one side), and prints each
# run's goodput (requests within the SLO per second of the run, as vllm
# bench defines it: it moves with the run's tail) and the share of requests
# within the SLO, P99 TTFT, where the requests went, the means, and the
# ratios the issue asks for (goodput within 5%, P99 TTFT within 10% of the
# single router).
#
#   bench/scripts/many-routers.sh                     # defaults below
#   PROMPTS=600 ROUNDS=1 POLICY=p2c bench/scripts/many-routers.sh
#
# Everything runs on loopback; every process it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

TRACE=${TRACE:-../shared/data/azure-llm-2023-conv.csv}
PROMPTS=${PROMPTS:-800}           # trace rows replayed per run
ROUTERS=${ROUTERS:-4}             # routers on the many side
ROUNDS=${ROUNDS:-2}               # (1 router, N routers) pairs
LOAD=${LOAD:-0.85}                # fraction of capacity
CAPACITY=${CAPACITY:-}            # req/s; probed when empty
# The probe runs in real time on a shared machine and moves with its load
# (14 and 22 req/s on two runs here). A machine-independent figure: the
# simulator's own saturated throughput in virtual time, per full-speed
# replica, times the fleet's speeds (1+1+1+0.5 = 3.5):
#   gpurouter sim predict --random-input-len 1155 --random-output-len 211 \
#     --random-range-ratio 0.8 --request-rate 10 --num-prompts 600
# says 5.38 req/s for the trace's mean lengths, so CAPACITY=18.8.
PROBE_RATES=${PROBE_RATES:-8,10,12,14,16,18,20,22}
PROBE_PROMPTS=${PROBE_PROMPTS:-400}
PROFILE=${PROFILE:-qwen2.5-7b}    # gpurouter sim profiles
SPEEDS=${SPEEDS:-1,1,1,0.5}       # one entry per replica
POLICY=${POLICY:-least_loaded}
SLO=${SLO:-ttft:2000 tpot:100}    # goodput SLOs, ms
BASE_PORT=${BASE_PORT:-19301}     # replicas; routers from BASE_PORT+100
SEED=${SEED:-1}
ROUTER_FLAGS=${ROUTER_FLAGS:-}    # extra `gpurouter serve` flags
SCRAPE=${SCRAPE:-}                # telemetry.interval of every router, e.g. 50ms; "" = the default
NEAR_EQUAL=${NEAR_EQUAL:-}        # routing.near_equal of every router (least_loaded, predictive), e.g. 2; "" = the default
BIN=${BIN:-}                      # a gpurouter binary; built from this tree when empty

[ -f "$TRACE" ] || { echo "trace $TRACE not found (TRACE=path)"; exit 2; }
work=$(mktemp -d)
bin=${BIN:-$work/gpurouter}
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
[ -n "$BIN" ] || go build -o "$bin" ./cmd/gpurouter

IFS=, read -r -a speeds <<<"$SPEEDS"
nrep=${#speeds[@]}
replicas=""
for i in $(seq 0 $((nrep - 1))); do replicas+="${replicas:+,}http://127.0.0.1:$((BASE_PORT + i))"; done

wait_up() { # URL: poll until it answers 200, at most 20 s
  for _ in $(seq 200); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "$1 did not come up"; exit 1
}

# start_fleet: a fresh simulated fleet for every run. The engines cache
# prompt prefixes, and every run replays the same prompts: a fleet kept
# from run to run would serve later runs from its cache, and whichever side
# ran second would look faster.
simpid=""
start_fleet() {
  stop_fleet
  "$bin" sim --replicas "$nrep" --base-port "$BASE_PORT" --profile "$PROFILE" --speed "$SPEEDS" \
    --served-model-name m --seed "$SEED" >"$work/sim.log" 2>&1 &
  simpid=$!
  pids+=("$simpid")
  for i in $(seq 0 $((nrep - 1))); do wait_up "http://127.0.0.1:$((BASE_PORT + i))/health"; done
}
stop_fleet() {
  if [ -n "$simpid" ]; then
    kill "$simpid" 2>/dev/null || true
    wait "$simpid" 2>/dev/null || true
    simpid=""
  fi
}

rport=$((BASE_PORT + 100))
# start_routers N: N routers on rport.., each scraping every replica;
# sets flags to their base URLs as repeated --base-url flags.
start_routers() {
  flags=""
  for i in $(seq 0 $(($1 - 1))); do
    if [ -n "$SCRAPE$NEAR_EQUAL" ]; then
      # The flags' configuration, with the scrape interval (and the
      # staleness bound, 5 intervals as by default) or near_equal changed.
      {
        echo "listen: 127.0.0.1:$((rport + i))"
        [ -z "$SCRAPE" ] || echo "telemetry: {interval: $SCRAPE, stale_after: $(awk -v s="${SCRAPE%ms}" 'BEGIN{print 5 * s}')ms}"
        [ -z "$NEAR_EQUAL" ] || echo "routing: {near_equal: $NEAR_EQUAL}"
        echo "pools:"
        echo "  - model: m"
        echo "    policy: $POLICY"
        echo "    replicas:"
        for u in ${replicas//,/ }; do echo "      - url: $u"; done
      } >"$work/router-$i.yaml"
      # shellcheck disable=SC2086
      "$bin" serve --config "$work/router-$i.yaml" $ROUTER_FLAGS >"$work/router-$i.log" 2>&1 &
    else
      # shellcheck disable=SC2086
      "$bin" serve --listen "127.0.0.1:$((rport + i))" --pool "m=$replicas" --policy "$POLICY" $ROUTER_FLAGS \
        >"$work/router-$i.log" 2>&1 &
    fi
    rpids+=($!)
    wait_up "http://127.0.0.1:$((rport + i))/ready"
    flags+=" --base-url http://127.0.0.1:$((rport + i))"
  done
}
stop_routers() {
  for p in "${rpids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${rpids[@]}"; do wait "$p" 2>/dev/null || true; done
  rpids=()
}
rpids=()
trap 'stop_routers; cleanup' EXIT

common=(--model m --backend openai --dataset-name azure-trace --dataset-path "$TRACE" --num-prompts "$PROMPTS"
  --seed "$SEED" --disable-tqdm --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 --goodput "$SLO")

# The trace's own rate over the replayed rows (req/s).
trace_rate=$(awk -F, -v n="$PROMPTS" 'NR==2{a=$1} NR==n+1{b=$1; exit} END{
  split(a,x,/[ :]/); split(b,y,/[ :]/);
  d=(y[2]*3600+y[3]*60+y[4])-(x[2]*3600+x[3]*60+x[4]); printf "%.4f", (n-1)/d}' "$TRACE")

if [ -z "$CAPACITY" ]; then
  start_fleet
  start_routers 1
  slo=$(echo "$SLO" | tr ' ' ',')
  # shellcheck disable=SC2086
  "$bin" bench sweep --request-rates "$PROBE_RATES" --slo "$slo" --cooldown 5s $flags "${common[@]}" \
    --num-prompts "$PROBE_PROMPTS" >"$work/probe.txt" 2>&1 || { cat "$work/probe.txt"; exit 1; }
  stop_routers
  # The capacity table's row: | target | max compliant rate | ...
  CAPACITY=$(awk -F'|' '/max compliant rate/ {getline; getline; gsub(/ /, "", $3); print $3; exit}' "$work/probe.txt")
  case $CAPACITY in
  '' | none | -) echo "capacity probe: no rate in $PROBE_RATES met the SLO:"; cat "$work/probe.txt"; exit 1 ;;
  esac
  grep -E '^\| 127' "$work/probe.txt" | head -20
fi
scale=$(awk -v c="$CAPACITY" -v l="$LOAD" -v r="$trace_rate" 'BEGIN{printf "%.4f", c*l/r}')
echo "fleet: $nrep x $PROFILE, speeds $SPEEDS; policy $POLICY; scrape ${SCRAPE:-default}; near_equal ${NEAR_EQUAL:-default}; capacity $CAPACITY req/s"
echo "workload: first $PROMPTS rows of $(basename "$TRACE") (trace rate $trace_rate req/s) at time scale $scale = $(awk -v r="$trace_rate" -v s="$scale" 'BEGIN{printf "%.2f", r*s}') req/s ($LOAD of capacity); goodput SLO $SLO"
printf '%-5s %-7s %10s %8s %7s %12s %12s %12s %7s  %s\n' run routers "goodput/s" "req/s" "in SLO" "P50 TTFT ms" "P99 TTFT ms" "P99 TPOT ms" failed "share per replica (last at half speed)"

# served: each replica's vllm:request_success_total, space-separated.
served() {
  for i in $(seq 0 $((nrep - 1))); do
    curl -fsS "http://127.0.0.1:$((BASE_PORT + i))/metrics" | awk '/^vllm:request_success_total/ {s += $NF} END {printf "%d ", s}'
  done
}

results=$work/results.txt
: >"$results"
for round in $(seq 1 "$ROUNDS"); do
  for n in 1 "$ROUTERS"; do
    start_fleet
    start_routers "$n"
    before=$(served)
    # shellcheck disable=SC2086
    "$bin" bench $flags "${common[@]}" --time-scale "$scale" >"$work/run.txt" 2>&1 || { cat "$work/run.txt"; exit 1; }
    after=$(served)
    stop_routers
    # Where the requests went: a herd shows as shares far from the
    # replicas' speeds (1 : 1 : 1 : 0.5 = 29% 29% 29% 14%).
    share=$(awk -v b="$before" -v a="$after" 'BEGIN{n = split(b, x, " "); split(a, y, " ");
      for (i = 1; i <= n; i++) t += y[i] - x[i];
      for (i = 1; i <= n; i++) printf "%d%% ", (t ? 100 * (y[i] - x[i]) / t : 0)}')
    g=$(awk '/Request goodput \(req\/s\):/{print $NF}' "$work/run.txt")
    t=$(awk '/Request throughput \(req\/s\):/{print $NF}' "$work/run.txt")
    p50=$(awk '/P50 TTFT \(ms\):/{print $NF}' "$work/run.txt")
    p99=$(awk '/P99 TTFT \(ms\):/{print $NF}' "$work/run.txt")
    tp=$(awk '/P99 TPOT \(ms\):/{print $NF}' "$work/run.txt")
    f=$(awk '/Failed requests:/{print $NF}' "$work/run.txt")
    slo_pct=$(awk -v g="$g" -v t="$t" 'BEGIN{printf "%.1f%%", t ? 100 * g / t : 0}')
    printf '%-5s %-7s %10s %8s %7s %12s %12s %12s %7s  %s\n' "$round" "$n" "$g" "$t" "$slo_pct" "$p50" "$p99" "$tp" "${f:-0}" "$share"
    echo "$n $g $p99 $t" >>"$results"
  done
done
awk -v many="$ROUTERS" '
  function median(a, n,   i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
    return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
  }
  $1==1 {g1+=$2; t1+=$3; r1+=$4; n1++; p1[n1]=$3; q1[n1]=$2} $1==many {gm+=$2; tm+=$3; rm+=$4; nm++; pm[nm]=$3; qm[nm]=$2}
  END {
    g1/=n1; t1/=n1; r1/=n1; gm/=nm; tm/=nm; rm/=nm
    printf "mean of %d rounds: 1 router goodput %.3f/s (%.1f%% in SLO), P99 TTFT %.1f ms; %d routers goodput %.3f/s (%.1f%% in SLO), P99 TTFT %.1f ms\n", n1, g1, 100*g1/r1, t1, many, gm, 100*gm/rm, tm
    dg=(gm-g1)/g1*100; dt=(tm-t1)/t1*100
    printf "means: goodput %+.1f%% (want within 5%%): %s; P99 TTFT %+.1f%% (want within 10%%): %s\n", dg, (dg>=-5 && dg<=5)?"ok":"MISS", dt, (dt<=10)?"ok":"MISS"
    mg1=median(q1, n1); mgm=median(qm, nm); mt1=median(p1, n1); mtm=median(pm, nm)
    printf "medians: goodput %.3f vs %.3f/s (%+.1f%%), P99 TTFT %.1f vs %.1f ms (%+.1f%%)\n", mg1, mgm, (mgm-mg1)/mg1*100, mt1, mtm, (mtm-mt1)/mt1*100
  }' "$results"
