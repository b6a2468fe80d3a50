#!/usr/bin/env bash
# Where a proxy's CPU goes (issue 15): user against kernel time, system calls
# and context switches per request at c=64 and per SSE event, for gpurouter
# and epoll-bare (the harness's Go proxy on its own epoll loop) next to
# HAProxy (requests) and nginx (events), in one `gpurouter bench
# proxy-cost` run. It answers what `bench proxy-cost` cannot: whether the
# router is costlier in its own code (user time) or in how it drives the
# kernel (system calls, wake-ups, thread switches).
#
# While the harness runs a phase, this script reads the proxy's utime and
# stime from /proc/PID/stat over CPU_WINDOW seconds, then counts its system
# calls (all; reads: read+recvfrom; writes: write+sendto+writev; epoll;
# futex; nanosleep) and context switches with `perf stat -p PID` over WINDOW
# seconds. Each figure is divided by the requests or events the phase served
# in that time (its n over its duration, from the harness's progress lines).
#
#   bench/scripts/proxy-cost-where.sh            # ~2 min
#   DUR=20s WINDOW=10 bench/scripts/proxy-cost-where.sh
#
# Needs perf (apt-get install -y linux-perf; perf_event_paranoid ≤ 2 or
# root), haproxy and nginx (apt-get install -y haproxy nginx). Run it on a
# quiet box: the figures are the proxy's own, but a busy box changes how
# often the proxy's threads sleep and wake.
set -euo pipefail
cd "$(dirname "$0")/../.."

DUR=${DUR:-12s}      # each c=64 and SSE phase of the harness
CPU_WINDOW=${CPU_WINDOW:-4} # seconds of CPU time read inside a phase
WINDOW=${WINDOW:-5}  # then seconds of system calls counted (both must fit in DUR - 2 s)
BIN=${BIN:-}

. bench/scripts/common.sh
needs perf haproxy nginx python3
setup_work

log=$work/harness.log
(cd "$work" && exec "$bin" bench proxy-cost --duration "$DUR" --c1-duration 200ms --reps 1 --retries -1 \
  --bare=false --idle-streams 10 >"$log" 2>&1) &
harness=$!

events=raw_syscalls:sys_enter,context-switches
for sc in read recvfrom write sendto writev epoll_pwait epoll_wait futex nanosleep; do
  events+=,syscalls:sys_enter_$sc
done

# sample NAME AFTER PIDPATTERN: once the harness has printed a line matching
# AFTER (the phase before the one to sample has ended), read the CPU time of
# the newest process matching PIDPATTERN over CPU_WINDOW seconds, then count
# its system calls over WINDOW seconds.
sample() {
  local name=$1 pid
  await_phase "$log" "$2" "$3"
  [ -n "$pid" ] || return 0
  # CPU first, unobserved (counting every system call costs the proxy
  # kernel time); then the counts.
  local t0 t1
  t0=$(awk '{print $14, $15}' "/proc/$pid/stat")
  sleep "$CPU_WINDOW"
  t1=$(awk '{print $14, $15}' "/proc/$pid/stat")
  echo "$t0 $t1 $(getconf CLK_TCK)" >"$work/$name.cpu"
  perf stat -x, -e "$events" -p "$pid" -o "$work/$name.perf" -- sleep "$WINDOW" 2>/dev/null
}

sample gpurouter-c64 "gpurouter  c=1 " "serve --listen 127.0.0.1"
sample gpurouter-sse "gpurouter  c=64" "serve --listen 127.0.0.1"
sample epoll-bare-c64 "epoll-bare c=1 " "proxy-cost --serve-loop"
sample epoll-bare-sse "epoll-bare c=64" "proxy-cost --serve-loop"
sample haproxy-c64 "haproxy    c=1 " "haproxy -db -f"
sample nginx-sse "nginx      c=64" "nginx -p"
wait "$harness" || { cat "$log"; exit 1; }

python3 - "$work" "$DUR" "$CPU_WINDOW" "$WINDOW" <<'EOF'
import os, re, sys
work, dur, cpu_window, window = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
m = re.fullmatch(r"([0-9.]+)(ms|s|m)", dur)
dur_s = float(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60}[m.group(2)]
rate = {}
for line in open(os.path.join(work, "harness.log")):
    m = re.match(r"rep 1 (\S+)\s+(c=64|sse)\s+n=(\d+)", line)
    if m:
        rate[(m.group(1), "c64" if m.group(2) == "c=64" else "sse")] = int(m.group(3)) / dur_s
rows = [("gpurouter", "c64"), ("epoll-bare", "c64"), ("haproxy", "c64"), ("gpurouter", "sse"), ("epoll-bare", "sse"), ("nginx", "sse")]
names = ["raw_syscalls:sys_enter", "context-switches"] + [f"syscalls:sys_enter_{x}" for x in
         ("read", "recvfrom", "write", "sendto", "writev", "epoll_pwait", "epoll_wait", "futex", "nanosleep")]
print(f"{'proxy':10} {'per':8} {'ops/s':>8} {'CPU µs':>7} {'user':>6} {'kernel':>7} {'syscalls':>9} {'reads':>6} {'writes':>6} {'epoll':>6} {'futex':>6} {'nanosleep':>9} {'switches':>9}")
for proxy, phase in rows:
    name = f"{proxy}-{phase}"
    r = rate.get((proxy, phase))
    try:
        u0, s0, u1, s1, hz = (float(x) for x in open(os.path.join(work, name + ".cpu")).read().split())
        counts = {}
        for line in open(os.path.join(work, name + ".perf")):
            f = line.strip().split(",")
            if len(f) > 2 and f[2] in names:
                counts[f[2]] = float(f[0]) if f[0].replace(".", "").isdigit() else 0.0
    except OSError:
        print(f"{proxy:10} {phase:8} (not sampled)")
        continue
    if not r:
        print(f"{proxy:10} {phase:8} (no rate in the harness log)")
        continue
    ops = r * cpu_window
    user, kern = (u1 - u0) / hz / ops * 1e6, (s1 - s0) / hz / ops * 1e6
    c = lambda *ks: sum(counts.get(k if k in names else "syscalls:sys_enter_" + k, 0.0) for k in ks) / (r * window)
    per = "request" if phase == "c64" else "event"
    print(f"{proxy:10} {per:8} {r:8.0f} {user + kern:7.1f} {user:6.1f} {kern:7.1f} {c('raw_syscalls:sys_enter'):9.2f} {c('read', 'recvfrom'):6.2f} "
          f"{c('write', 'sendto', 'writev'):6.2f} {c('epoll_pwait', 'epoll_wait'):6.2f} {c('futex'):6.2f} {c('nanosleep'):9.3f} {c('context-switches'):9.2f}")
print(f"\nCPU, user and kernel time in µs per request (c=64) or per SSE event, over {cpu_window:.0f} s of each {dur} phase"
      f" (/proc/PID/stat, 10 ms ticks); then counts per request or event over the next {window:.0f} s (perf stat).")
EOF
