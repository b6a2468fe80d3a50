# Shared by the scripts that measure proxies while `gpurouter bench
# proxy-cost` runs (proxy-cost-where.sh, c1-path.sh); sourced, not run.

# needs TOOL...: exits 2 naming the first one not installed.
needs() {
  local t
  for t; do
    command -v "$t" >/dev/null || { echo "$t not found (see the header of $0)"; exit 2; }
  done
}

# setup_work: work, a temporary folder removed at exit once the jobs
# started in the background are stopped; bin, the gpurouter binary to
# measure: $BIN, or one built from this checkout into $work.
setup_work() {
  work=$(mktemp -d)
  trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
  bin=${BIN:-$work/gpurouter}
  [ -n "${BIN:-}" ] || go build -o "$bin" ./cmd/gpurouter
  bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
}

# await_phase LOG AFTER PIDPATTERN: once the harness has written a line
# matching AFTER to LOG (the run before the one to measure has ended) and
# 1.5 s more have passed, pid is the newest process matching PIDPATTERN;
# empty, with a line on stderr, when there is none.
await_phase() {
  local log=$1 after=$2 pat=$3 i
  for i in $(seq 600); do grep -q -- "$after" "$log" && break; sleep 0.2; done
  sleep 1.5
  pid=$(pgrep -n -f -- "$pat" || true)
  [ -n "$pid" ] || echo "no process matches $pat" >&2
}
