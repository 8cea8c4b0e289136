#!/usr/bin/env bash
# Sampling overhead of `headroom run` on a CPU-bound child, at 20 Hz (50ms) and 100 Hz (10ms).
#
# Two measures, side by side in one run:
#  1. headroom's own CPU time (getrusage(RUSAGE_SELF), reported as `headroom_cpu_s` in --json)
#     divided by the run's wall time: the share of one core the sampler costs;
#  2. the child's wall time bare and under headroom (hyperfine), as a ratio.
#
# Usage: bench/run/overhead.sh   (from the repository root; builds nothing but the C child)
#        HEADROOM=path/to/headroom RUNS=7 WORK_ROUNDS=30 bench/run/overhead.sh
set -euo pipefail
HEADROOM=${HEADROOM:-target/release/headroom}
RUNS=${RUNS:-7}
WORK_ROUNDS=${WORK_ROUNDS:-30}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cc -O1 -o "$scratch/spin" bench/run/spin.c

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

for interval in 50ms 10ms; do
    for _ in $(seq "$RUNS"); do
        "$HEADROOM" run --interval "$interval" --json "$scratch/report.json" -- "$scratch/spin" "$WORK_ROUNDS" >/dev/null 2>&1
        python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
rung = r["rungs"][0]
print(100 * r["headroom_cpu_s"] / rung["duration_s"], len(rung["samples"]) / rung["duration_s"])' "$scratch/report.json"
    done >"$scratch/$interval.txt"
    echo "interval $interval: headroom CPU, % of one core (median of $RUNS): $(cut -d' ' -f1 "$scratch/$interval.txt" | median)" \
         "· samples/s: $(cut -d' ' -f2 "$scratch/$interval.txt" | median)"
done

hyperfine --warmup 1 --runs "$RUNS" --style basic \
    --command-name bare "$scratch/spin $WORK_ROUNDS" \
    --command-name "headroom 20 Hz" "$HEADROOM run --interval 50ms -- $scratch/spin $WORK_ROUNDS" \
    --command-name "headroom 100 Hz" "$HEADROOM run --interval 10ms -- $scratch/spin $WORK_ROUNDS" \
    --export-markdown "$scratch/wall.md" >/dev/null 2>&1
cat "$scratch/wall.md"
