#!/usr/bin/env bash
# The governor's CPU time per compiler call, for two builds of headroom in turn: each pair runs
# one `headroom build` of CALLS governed calls of `true` (by a compiler's name, `cc`) under
# each binary, alternated, each with a history of its own that the first pair warms, and reads
# the governor's CPU time (its threads' `schedstat`) once the calls are done, before the
# session ends. Prints microseconds per call for each run, then the medians.
# Usage: bench/build/governor-cpu.sh BEFORE AFTER [CALLS] [PAIRS]   (two headroom binaries)
set -euo pipefail
[ $# -ge 2 ] && [ -x "$1" ] && [ -x "$2" ] || { echo "usage: $0 BEFORE AFTER [CALLS] [PAIRS]"; exit 2; }
binaries=("$(realpath "$1")" "$(realpath "$2")")
cd "$(dirname "$0")/../.."
source bench/lib.sh
names=(before after)
calls=${3:-2000}
pairs=${4:-4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$(type -P true)" "$work/cc"

# cpu_per_call BINARY STATE: runs the calls and prints the governor's CPU µs per call.
cpu_per_call() {
  local done=$work/done
  rm -f "$done"
  (cd "$work" && HEADROOM_STATE_DIR=$2 exec "$1" build -- \
    bash -c "for i in \$(seq $calls); do ./cc; done; touch '$done'; sleep 2" >/dev/null 2>&1) &
  local build=$!
  local governor=
  until [ -e "$done" ]; do
    [ -n "$governor" ] || governor=$(governor_of "$build")
    sleep 0.05
  done
  local ns=0 thread
  for thread in /proc/"$governor"/task/*/schedstat; do
    ns=$((ns + $(cut -d' ' -f1 "$thread")))
  done
  wait "$build"
  echo $((ns / calls / 1000))
}

results=()
for pair in $(seq 0 "$pairs"); do
  for i in 0 1; do
    us=$(cpu_per_call "${binaries[$i]}" "$work/state-$i")
    # Pair 0 warms each history and is not counted.
    [ "$pair" -gt 0 ] || continue
    echo "pair $pair ${names[$i]}: $us µs per call"
    results+=("${names[$i]} $us")
  done
done
printf '%s\n' "${results[@]}" | python3 -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    name, us = line.split()
    runs.setdefault(name, []).append(int(us))
for name, values in runs.items():
    print(f"{name}: median {statistics.median(values)} µs per call ({min(values)}–{max(values)})")'
