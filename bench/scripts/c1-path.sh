#!/usr/bin/env bash
# Where a request's time goes at c=1 (issue 15, bound 4), phase by phase, for
# gpurouter, HAProxy and nginx in one `gpurouter bench proxy-cost` run. The
# harness gives each proxy's added p50 at c=1; this script splits a request's
# path through the proxy from the timestamps of its system calls:
#
#   in→engine   the client's request read (recvfrom entered) until the
#               engine's request is written (its write returned)
#   engine      that write's return until the engine's answer is read
#   answer      the engine's answer read until the client's answer is written
#   client      that write's return until the client's next request is read
#
# and, within the first and third, the proxy's own user time between the
# read's return and the write's entry (its parsing and deciding). Medians
# over every request in WINDOW seconds. It also counts system calls per
# request and the threads the proxying ran on.
#
#   bench/scripts/c1-path.sh                  # ~1 min
#   DUR=20s WINDOW=8 bench/scripts/c1-path.sh
#
# Tracing every system call costs each proxy about a microsecond a call, so
# the phases are longer than untraced; compare the proxies with one another,
# not with `bench proxy-cost`'s figures. Needs perf (linux-perf; root, or
# perf_event_paranoid ≤ 1 and tracefs readable), ss (iproute2), python3,
# haproxy and nginx. How an idle vCPU waits changes every phase on a VM
# (README, "Where it stands"); the heading of the harness's report says which.
set -euo pipefail
cd "$(dirname "$0")/../.."

DUR=${DUR:-10s}    # each proxy's c=1 run
WINDOW=${WINDOW:-3} # seconds traced inside it (≤ DUR - 3 s)
BIN=${BIN:-}

. bench/scripts/common.sh
needs perf ss python3 haproxy nginx
setup_work

log=$work/harness.log
(cd "$work" && exec "$bin" bench proxy-cost --workloads c1 --c1-duration "$DUR" --reps 1 --retries -1 \
  --bare=false --loop=false >"$log" 2>&1) &
harness=$!

# trace NAME AFTER PIDPATTERN: once the harness has printed a line matching
# AFTER (the run before NAME's has ended), record the system calls of the
# newest process matching PIDPATTERN for WINDOW seconds, and note its TCP
# sockets (ss) to tell the client's connection from the engine's.
trace() {
  local name=$1 pid
  await_phase "$log" "$2" "$3"
  [ -n "$pid" ] || return 0
  ss -tnpH state listening | grep "pid=$pid," >"$work/$name.listen" || true
  ss -tnpH state established | grep "pid=$pid," >"$work/$name.conns" || true
  perf record -q -e raw_syscalls:sys_enter,raw_syscalls:sys_exit -p "$pid" -o "$work/$name.data" -- sleep "$WINDOW" 2>/dev/null
  perf script -i "$work/$name.data" -F tid,time,event,trace 2>/dev/null >"$work/$name.txt"
}

trace gpurouter "direct     c=1 " "serve --listen 127.0.0.1"
trace haproxy "gpurouter  c=1 " "haproxy -db -f"
trace nginx "haproxy    c=1 " "nginx -p"
wait "$harness" || { cat "$log"; exit 1; }
grep -E "^(proxy cost|upstream on)" "$log" || true

python3 - "$work" "$log" <<'EOF'
import collections, os, re, statistics, sys
work, log = sys.argv[1], sys.argv[2]
upstream = re.search(r"upstream on \S+:(\d+)", open(log).read()).group(1)
RECV, SEND = {0, 17, 19, 45, 47}, {1, 18, 20, 44, 46}  # read pread readv recvfrom recvmsg; write pwrite writev sendto sendmsg
WAIT = {7, 232, 281, 441}                                # poll epoll_wait epoll_pwait epoll_pwait2
line_re = re.compile(r"\s*(\d+)\s+([\d.]+):\s+raw_syscalls:sys_(enter|exit): NR (\d+)(?: \(([0-9a-f]+))?")
fd_re = re.compile(r"fd=(\d+)")

def port(addr):
    return addr.rsplit(":", 1)[1]

def sockets(name):
    listen = {port(l.split()[2]) for l in open(os.path.join(work, name + ".listen")) if len(l.split()) > 2}
    clients, engines = set(), set()
    for l in open(os.path.join(work, name + ".conns")):
        f = l.split()
        if len(f) < 5:  # Recv-Q Send-Q local peer users: ss omits the state it was asked for
            continue
        fds = {int(x) for x in fd_re.findall(l)}
        if port(f[3]) == upstream:
            engines |= fds
        elif port(f[2]) in listen:
            clients |= fds
    return clients, engines

def med(v):
    return f"{statistics.median(v):6.1f}" if v else "     -"

print(f"\n{'proxy':10} {'requests':>8} {'in→engine':>9} {'(user)':>7} {'engine':>7} {'answer':>7} {'(user)':>7} {'client':>7} {'cycle':>7} {'calls':>6} {'threads':>8}")
for name in ("gpurouter", "haproxy", "nginx"):
    path = os.path.join(work, name + ".txt")
    if not os.path.exists(path):
        print(f"{name:10} (not traced)")
        continue
    clients, engines = sockets(name)
    calls, open_call = collections.Counter(), {}
    last_exit = {}        # tid -> (time, kind) of the proxy's last client/engine read or write
    ph = collections.defaultdict(list)
    cyc_start, marks, by_tid = None, {}, collections.Counter()
    n_calls = 0
    for line in open(path):
        m = line_re.match(line)
        if not m:
            continue
        tid, t, kind, nr, a0 = m.group(1), float(m.group(2)) * 1e6, m.group(3), int(m.group(4)), m.group(5)
        if kind == "enter":
            n_calls += 1
            fd = int(a0, 16) if a0 and (nr in RECV or nr in SEND) else -1
            what = None
            if fd in clients:
                what = "crecv" if nr in RECV else "csend"
            elif fd in engines:
                what = "erecv" if nr in RECV else "esend"
            open_call[tid] = (what, t)
            if what == "crecv":
                if cyc_start is not None and "csend" in marks:
                    ph["client"].append(t - marks["csend"])
                    ph["cycle"].append(t - cyc_start)
                    if "esend" in marks and "erecv" in marks:
                        ph["in"].append(marks["esend"] - cyc_start)
                        ph["engine"].append(marks["erecv"] - marks["esend"])
                        ph["answer"].append(marks["csend"] - marks["erecv"])
                cyc_start, marks = t, {}
            elif what == "erecv" and "erecv" not in marks and cyc_start is not None:
                marks["erecv"] = t
            if what in ("esend", "csend") and tid in last_exit:
                prev, pt = last_exit[tid]
                if (prev, what) == ("crecv", "esend"):
                    ph["in_user"].append(t - pt)
                elif (prev, what) == ("erecv", "csend"):
                    ph["answer_user"].append(t - pt)
        else:
            what, _ = open_call.pop(tid, (None, 0))
            if what:
                last_exit[tid] = (what, t)
                by_tid[tid] += 1
                if what in ("esend", "csend") and cyc_start is not None and what not in marks:
                    marks[what] = t
    n = len(ph["cycle"])
    if not n:
        print(f"{name:10} (no request seen: clients {sorted(clients)}, engines {sorted(engines)})")
        continue
    top = by_tid.most_common()
    share = "/".join(f"{100 * c / sum(by_tid.values()):.0f}" for _, c in top[:3])
    print(f"{name:10} {n:8d} {med(ph['in']):>9} {med(ph['in_user']):>7} {med(ph['engine']):>7} {med(ph['answer']):>7} "
          f"{med(ph['answer_user']):>7} {med(ph['client']):>7} {med(ph['cycle']):>7} {n_calls / n:6.2f} {len(top):3d} {share}")
print("\nMedians in µs over the requests traced; (user): the proxy's time between its read's return and its write's entry;"
      "\ncalls: system calls per request; threads: how many did the proxying, and their shares (%) of its reads and writes.")
EOF
