# Sourced by lora-fleet.sh when RUN is set: each front of RUN in turn,
# each on a fresh fleet, then the summary. Uses lora-fleet.sh's variables
# (bin, work, pids, rate, adapter_flags, start_fleet, ...).
mkdir -p "$OUT"
front=$((BASE_PORT + 100))
replicas="" engines=() haproxy_sed=() yaml_reps=""
for i in $(seq 0 $((REPLICAS - 1))); do
  replicas+="${replicas:+,}http://127.0.0.1:$((BASE_PORT + i))"
  engines+=(--engine-url "http://127.0.0.1:$((BASE_PORT + i))")
  haproxy_sed+=(-e "s/REPLICA_PORT_$i\\b/$((BASE_PORT + i))/")
  yaml_reps+="      - url: http://127.0.0.1:$((BASE_PORT + i))"$'\n'
done
echo "capacity: $per req/s per replica x $REPLICAS x $LOAD = $rate req/s; ${HOT:+lora-0 at $HOT of the requests; }results in $OUT"

stop() { # stops the processes started for one front
  for p in "$@"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

for f in $RUN; do
  start_fleet
  case $f in
  router | blind)
    aware=true
    [ "$f" = blind ] && aware=false
    cat >"$work/router-$f.yaml" <<EOF
listen: 127.0.0.1:$front
log:
  level: warn
routing:
  bounded_load_epsilon: ${EPSILON:-0.25}
pools:
  - model: m
    lora:
      aware: $aware
    replicas:
$yaml_reps
EOF
    "$bin" serve --config "$work/router-$f.yaml" >"$OUT/front-$f.log" 2>&1 &
    ;;
  haproxy)
    sed -e "s/LISTEN_PORT/$front/" "${haproxy_sed[@]}" bench/scripts/haproxy.cfg >"$work/haproxy.cfg"
    haproxy -f "$work/haproxy.cfg" -db >"$OUT/front-$f.log" 2>&1 &
    ;;
  *) echo "unknown front $f (router, blind, haproxy)"; exit 1 ;;
  esac
  front_pid=$!
  pids+=("$front_pid")
  for _ in $(seq 100); do
    curl -fsS -o /dev/null "http://127.0.0.1:$front/v1/models" 2>/dev/null && break
    sleep 0.1
  done
  # The router reads the replicas' adapters at start: give it that moment.
  sleep 1
  echo "== $f"
  # shellcheck disable=SC2086 # GOODPUT is several words
  "$bin" bench --base-url "http://127.0.0.1:$front" --model m --dataset-name random \
    --random-input-len "$IN_LEN" --random-output-len "$OUT_LEN" --random-range-ratio 0.5 --ignore-eos \
    --num-prompts "$PROMPTS" --request-rate "$rate" --seed "$SEED" "${adapter_flags[@]}" \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --goodput $GOODPUT "${engines[@]}" \
    --save-result --result-filename "$OUT/lora-$f.json" >"$OUT/bench-$f.txt" 2>&1 || { cat "$OUT/bench-$f.txt"; exit 1; }
  for i in $(seq 0 $((REPLICAS - 1))); do
    curl -fsS "http://127.0.0.1:$((BASE_PORT + i))/metrics" | grep -E '^(gpurouter_sim_lora_requests_total|vllm:request_success_total)' |
      sed "s/^/r$i /" >>"$OUT/replicas-$f.txt" || true
  done
  stop "$front_pid" "$sim_pid"
done

python3 - "$OUT" "$REPLICAS" $RUN <<'EOF'
import json, re, sys
out, n, fronts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for f in fronts:
    d = json.load(open(f"{out}/lora-{f}.json"))
    total, by_rep, hot = 0, {}, {}
    for line in open(f"{out}/replicas-{f}.txt"):
        rep, rest = line.split(" ", 1)
        name, val = rest.rsplit(" ", 1)
        v = float(val)
        if name.startswith("gpurouter_sim_lora_requests_total"):
            by_rep[rep] = by_rep.get(rep, 0) + v
            if 'lora_name="lora-0"' in name:
                hot[rep] = hot.get(rep, 0) + v
    reqs = sum(by_rep.values()) or 1
    sw = (d.get("gpurouter_lora_swaps") or {}).get("per_1000_requests", float("nan"))
    fl = d.get("gpurouter_lora_swap_floor") or {}
    rows[f] = dict(offline=fl.get("offline_per_1000_requests", float("nan")), online=fl.get("online_per_1000_requests", float("nan")),
                   ttft=d.get("p99_ttft_ms"), goodput=d.get("request_goodput"), thr=d.get("request_throughput"),
                   done=d.get("completed"), failed=d.get("failed", 0), swaps=sw,
                   share={r: v / reqs for r, v in sorted(by_rep.items())},
                   hot={r: v / (sum(hot.values()) or 1) for r, v in sorted(hot.items())})
print(f"\n| front | completed | failed | P99 TTFT (ms) | goodput (req/s) | throughput (req/s) | swaps / 1k req | floor: offline, online | share of requests by replica | share of lora-0's by replica |")
print("|---|---|---|---|---|---|---|---|---|---|")
fmt = lambda m: " ".join(f"{r}:{100*v:.0f}%" for r, v in m.items())
for f, r in rows.items():
    print(f"| {f} | {r['done']} | {r['failed']} | {r['ttft']:.0f} | {r['goodput']:.2f} | {r['thr']:.2f} | {r['swaps']:.1f} | {r['offline']:.1f}, {r['online']:.1f} | {fmt(r['share'])} | {fmt(r['hot'])} |")
first = fronts[0]
for f in fronts[1:]:
    a, b = rows[first], rows[f]
    print(f"{first} vs {f}: P99 TTFT {b['ttft'] / a['ttft']:.2f}x lower, goodput {a['goodput'] / max(b['goodput'], 1e-9):.2f}x higher, "
          f"swaps {b['swaps'] / max(a['swaps'], 1e-9):.2f}x fewer; the most fewer swaps any placement that takes "
          f"each request as it comes could give: {b['swaps'] / max(a['online'], 1e-9):.2f}x ({b['swaps'] / max(a['offline'], 1e-9):.2f}x knowing every request ahead)")
for f, r in rows.items():
    top = max(r["share"].values()) if r["share"] else 0
    print(f"{f}: largest replica share {100*top:.0f}% = {top * n:.2f}x its capacity share; lora-0 on {sum(1 for v in r['hot'].values() if v > 0.05)} replicas (>5% of its requests)")
EOF
