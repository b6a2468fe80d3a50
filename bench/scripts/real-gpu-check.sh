#!/usr/bin/env bash
# Proves the NVML path against a real NVIDIA GPU: `gpurouter agent` and a
# router reading the same GPU, locally (gpu.index) and through the agent
# (gpu.agent_url), idle and under a load, each reading set beside
# nvidia-smi's; then an application's GPU fault (a CUDA kernel writing
# through a null pointer, with CuPy), whose Xid both must log and neither may
# count against the GPU. Needs the driver (libnvidia-ml.so.1) and nvidia-smi;
# the load needs PyTorch and the fault CuPy in python3 (each step is skipped,
# saying so, without them).
#
# usage: BIN=./gpurouter [GPU_TEST=./gpu.test] bench/scripts/real-gpu-check.sh OUTDIR
#   BIN       a gpurouter binary built with cgo (.ci/build BIN)
#   GPU_TEST  optional: `go test -c ./gpu` output; runs TestNVMLRealLibrary
#   LOAD_S    seconds of GPU load (default 20)
# Ports 19401 (agent), 18001-18002 (sims) and 18080 (router) on loopback.
set -uo pipefail
out=${1:?usage: BIN=... real-gpu-check.sh OUTDIR}
bin=${BIN:?BIN=path to gpurouter}
load_s=${LOAD_S:-20}
mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

q=index,uuid,name,utilization.gpu,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm,clocks.max.sm
smi() { nvidia-smi --query-gpu=$q --format=csv,noheader,nounits | tee "$out/smi-$1.csv"; }
get() { curl -fsS --max-time 5 "$1"; }
waitfor() { # url, tries of 0.1 s
	for _ in $(seq "$2"); do get "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
	echo "not answering: $1" >&2; return 1
}
# One GPU's fields from the agent's JSON, in nvidia-smi's units.
agentrow() {
	python3 - "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for g in r["gpus"]:
    print(f'{g["index"]}, {g["uuid"]}, {g.get("name","")}, {g["utilization_pct"]:.0f}, '
          f'{g["memory_used_bytes"]/2**20:.0f}, {g["memory_total_bytes"]/2**20:.0f}, {g["power_watts"]:.2f}, '
          f'{g.get("power_limit_watts",0):.2f}, {g["temperature_c"]:.0f}, {g["sm_clock_mhz"]}, {g.get("sm_clock_max_mhz",0)}'
          f'  throttle={g.get("throttle_reasons",[])} xid={g["xid_errors"]} ecc={g["ecc_uncorrected"]}')
EOF
}

# The router's operators' page: each replica's GPU cells (util, memory,
# power, temperature, capacity credited).
statuscells() {
	python3 - "$1" <<'EOF'
import re, sys
html = open(sys.argv[1]).read()
for name, row in re.findall(r'<tr class="replica" data-replica="([^"]+)">(.*?)</tr>', html, re.S):
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    print("status page:", name, cells[9:14])
EOF
}

echo "== host"
uname -a
nvidia-smi -L
ldconfig -p | grep -m1 libnvidia-ml.so.1 || echo "libnvidia-ml.so.1 not in ldconfig"

if [ -n "${GPU_TEST:-}" ]; then
	echo "== go test: TestNVMLRealLibrary (real go-nvml, no mock)"
	"$GPU_TEST" -test.run '^TestNVMLRealLibrary$' -test.v 2>&1 | tee "$out/gpu-test.txt"
fi

echo "== gpurouter agent"
"$bin" agent --listen 127.0.0.1:19401 >"$out/agent.log" 2>&1 &
pids+=($!)
waitfor http://127.0.0.1:19401/health 100 || exit 1
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)

echo "== router: sim replica a reads GPU 0 by NVML index, b through the agent by UUID"
"$bin" sim --replicas 2 --base-port 18001 --served-model-name sim >"$out/sim.log" 2>&1 &
pids+=($!)
cat >"$out/router.yaml" <<EOF
listen: 127.0.0.1:18080
telemetry:
  gpu_interval: 500ms
pools:
  - model: sim
    replicas:
      - url: http://127.0.0.1:18001
        name: local-nvml
        gpu:
          index: 0
      - url: http://127.0.0.1:18002
        name: via-agent
        gpu:
          agent_url: http://127.0.0.1:19401
          uuid: $uuid
EOF
"$bin" serve --config "$out/router.yaml" >"$out/router.log" 2>&1 &
pids+=($!)
waitfor http://127.0.0.1:18001/health 100 || exit 1
waitfor http://127.0.0.1:18080/ready 100 || exit 1
sleep 1.5

snap() { # phase
	smi "$1"
	get http://127.0.0.1:19401/v1/gpus >"$out/agent-$1.json" && agentrow "$out/agent-$1.json"
	get http://127.0.0.1:19401/metrics | grep '^gpurouter_gpu_' >"$out/agent-metrics-$1.txt"
	get http://127.0.0.1:18080/metrics | grep '^gpurouter_replica_gpu_' | tee "$out/router-gpu-$1.txt"
	get http://127.0.0.1:18080/status >"$out/status-$1.html" && statuscells "$out/status-$1.html"
}
echo "== idle: nvidia-smi, then the agent (same columns), then the router's metrics and status page"
snap idle

echo "== a request through the router"
curl -fsS --max-time 10 -H 'Content-Type: application/json' \
	-d '{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":8}' \
	http://127.0.0.1:18080/v1/chat/completions | tee "$out/chat.json"
echo

echo "== busy: ${load_s}s of bf16 matrix products and 32 GiB held"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
	python3 - "$load_s" >"$out/load.log" 2>&1 <<'EOF' &
import sys, time, torch
hold = torch.empty(32 * 2**30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    if n == 0:
        print("running", flush=True)
    n += 20
print("products", n)
EOF
	load=$!
	# Importing PyTorch and starting CUDA take seconds: read the GPU once
	# the products run, half the load's time in.
	for _ in $(seq 600); do grep -q running "$out/load.log" 2>/dev/null && break; sleep 0.1; done
	sleep $((load_s / 2))
	snap busy
	wait "$load"
	cat "$out/load.log"
else
	echo "no PyTorch with CUDA: no load"
fi
sleep 3
echo "== after the load"
snap after

echo "== an application's GPU fault: a CUDA kernel writing through a null pointer (Xid 31 or 13)"
if python3 -c 'import cupy' 2>/dev/null; then
	python3 - >"$out/fault.log" 2>&1 <<'EOF'
import os, sys
import cupy as cp
k = cp.RawKernel(r'extern "C" __global__ void bad() { *(volatile int *)0x10 = 1; }', "bad")
try:
    k((1,), (1,), ())
    cp.cuda.runtime.deviceSynchronize()
    print("the kernel ran without a fault")
except Exception as e:
    print("CUDA error, as meant:", e)
sys.stdout.flush()
os._exit(0)  # the broken context would fail CuPy's module unload at exit, noisily
EOF
	cat "$out/fault.log"
	sleep 2 # a GPU read (router: 500 ms, agent: each request) drains the Xid events
	get http://127.0.0.1:19401/v1/gpus >"$out/agent-fault.json" && agentrow "$out/agent-fault.json"
	get http://127.0.0.1:18080/metrics | grep '^gpurouter_replica_gpu_fault'
	dmesg 2>/dev/null | grep -i xid | tail -3 || true
else
	echo "no CuPy: no fault"
fi

echo "== agent and router logs: NVML lines"
grep 'NVML\|GPU telemetry\|Xid' "$out/agent.log" "$out/router.log"
kill -TERM "${pids[0]}"
wait "${pids[0]}" 2>/dev/null
echo "agent exit after SIGTERM: $?"
