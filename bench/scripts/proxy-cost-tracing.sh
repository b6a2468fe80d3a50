#!/usr/bin/env bash
# What tracing costs the data plane (issue 55): one `gpurouter bench
# proxy-cost` run that measures gpurouter as it starts by default (tracing
# off) beside gpurouter-traced, the same router with tracing on at
# sampling ratio 1.0, every request's spans exported over OTLP/gRPC to a
# real OpenTelemetry Collector (writing them to a file). Both columns are
# measured by the harness alike: CPU per request and per event from the
# router's own /proc figures, so the Collector's CPU is not the router's.
#
#   bench/scripts/proxy-cost-tracing.sh                 # ~1 min, HAProxy and nginx when installed
#   ARGS="--reps 3 --duration 3s" bench/scripts/proxy-cost-tracing.sh
#
# The Collector is $OTELCOL, else the one .ci/run builds and caches
# (.ci/otelcol/build). The Collector shares the box: on a small one its
# CPU while the traced column runs makes the harness mark runs noisy.
set -euo pipefail
cd "$(dirname "$0")/../.."

ARGS=${ARGS:---reps 1 --duration 2s --c1-duration 1s --idle-streams 100 --bare=false --loop=false}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpurouter-ci/bin
otelcol=${OTELCOL:-$cache/otelcol}
BIN=${BIN:-}

. bench/scripts/common.sh
needs python3
[ -x "$otelcol" ] || { echo "no OpenTelemetry Collector at $otelcol (OTELCOL, or .ci/otelcol/build $otelcol)"; exit 2; }
setup_work

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
upstream=127.0.0.1:$(port) grpc=127.0.0.1:$(port) http=127.0.0.1:$(port) listen=127.0.0.1:$(port)

cat >"$work/otelcol.yaml" <<EOF
receivers:
  otlp:
    protocols:
      grpc: {endpoint: "$grpc"}
      http: {endpoint: "$http"}
exporters:
  file: {path: "$work/spans.json", format: json}
service:
  telemetry: {metrics: {level: none}, logs: {level: warn}}
  pipelines:
    traces: {receivers: [otlp], exporters: [file]}
EOF
"$otelcol" --config "$work/otelcol.yaml" >"$work/otelcol.log" 2>&1 &

# The router as `bench proxy-cost` starts its gpurouter column (serve
# --pool m=http://UPSTREAM: every default), with tracing on.
cat >"$work/router.yaml" <<EOF
listen: "$listen"
pools:
  - model: m
    replicas: [{url: "http://$upstream"}]
tracing:
  endpoint: "http://$grpc"
  sampling_ratio: 1.0
EOF
"$bin" serve --config "$work/router.yaml" >"$work/router.log" 2>&1 &
router=$!
for _ in $(seq 100); do curl -fs "http://$listen/health" >/dev/null 2>&1 && break; sleep 0.1; done

# shellcheck disable=SC2086 # ARGS is a list of flags
"$bin" bench proxy-cost --upstream "$upstream" --target "gpurouter-traced=$listen,pid=$router" $ARGS
kill -TERM "$router"; wait "$router" || true
echo "spans written by the Collector: $(grep -o '"spanId"' "$work/spans.json" 2>/dev/null | wc -l)"
