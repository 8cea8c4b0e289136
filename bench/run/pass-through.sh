#!/usr/bin/env bash
# What `headroom run` costs a command whose output passes through it, and whether a reader
# that goes away ends the run: each command alone and under `headroom run`, interleaved,
# REPEATS times (default 5); prints the medians and their ratio.
#
#   cargo build --release -p headroom && bench/run/pass-through.sh [HEADROOM]
set -euo pipefail
headroom="${1:-target/release/headroom}"
repeats="${REPEATS:-5}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
export HEADROOM_STATE_DIR="$scratch/state"

seconds() { # seconds COMMAND: wall seconds of one run, at most 30 s
  local start end
  start=$(date +%s.%N)
  timeout 30 bash -c "$1" >/dev/null 2>&1 || true
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

printf '| command | alone s | headroom run s | ratio |\n|---|---:|---:|---:|\n'
for case in "yes | head -1" "seq 30000000 | head -1" "200 MB to /dev/null" "200 MB to a file"; do
  case "$case" in
    "yes | head -1") alone="yes | head -1"; wrapped="$headroom run -- yes | head -1" ;;
    "seq 30000000 | head -1") alone="seq 30000000 | head -1"; wrapped="$headroom run -- seq 30000000 | head -1" ;;
    "200 MB to /dev/null") alone="sh -c 'yes | head -c 200000000' >/dev/null"; wrapped="$headroom run -- sh -c 'yes | head -c 200000000' >/dev/null" ;;
    *) alone="sh -c 'yes | head -c 200000000' >$scratch/out"; wrapped="$headroom run -- sh -c 'yes | head -c 200000000' >$scratch/out" ;;
  esac
  : >"$scratch/alone"; : >"$scratch/wrapped"
  for _ in $(seq "$repeats"); do
    seconds "$alone" >>"$scratch/alone"
    seconds "$wrapped" >>"$scratch/wrapped"
  done
  a=$(median <"$scratch/alone"); w=$(median <"$scratch/wrapped")
  printf '| `%s` | %.3f | %.3f | %.2f |\n' "$case" "$a" "$w" "$(echo "$w / $a" | bc -l)"
done
