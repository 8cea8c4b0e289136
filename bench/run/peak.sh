#!/usr/bin/env bash
# Peak accuracy of `headroom run` against the kernel's own peak, at the default 20 Hz.
#
#  - one process: the sampled tree peak vs getrusage(RUSAGE_CHILDREN).ru_maxrss (the kernel's
#    high-water mark of the process);
#  - a tree of 8: `sh` starting 8 processes that each hold the same amount at once, run inside
#    its own cgroup (--memory-limit well above need) so the kernel's peak is the cgroup's
#    max_usage_in_bytes (v1) / memory.peak (v2).
#
# Usage: bench/run/peak.sh   (from the repository root)   RUNS=5 MIB=512 bench/run/peak.sh
set -euo pipefail
HEADROOM=${HEADROOM:-target/release/headroom}
RUNS=${RUNS:-5}
MIB=${MIB:-512}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cc -O1 -o "$scratch/alloc" bench/run/alloc.c

error_pct() {
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["rungs"][0]
kernel = r["peak"]["kernel"]["cgroup"] if sys.argv[2] == "cgroup" else r["peak"]["kernel"]["largest_process"]
print(100 * (r["peak"]["rss"] - kernel) / kernel, r["peak"]["rss"], kernel)' "$@"
}

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

for _ in $(seq "$RUNS"); do
    "$HEADROOM" run --json "$scratch/one.json" -- "$scratch/alloc" "$MIB" 1.0 >/dev/null 2>&1
    error_pct "$scratch/one.json" rusage
done >"$scratch/one.txt"
echo "one process, $MIB MiB: sampled - kernel, % of kernel (median of $RUNS): $(cut -d' ' -f1 "$scratch/one.txt" | median)"

per_child=$((MIB / 8))
tree="for i in 1 2 3 4 5 6 7 8; do $scratch/alloc $per_child 1.0 & done; wait"
for _ in $(seq "$RUNS"); do
    if ! "$HEADROOM" run --memory-limit $((MIB * 4))M --json "$scratch/tree.json" -- sh -c "$tree" >/dev/null 2>"$scratch/err"; then
        echo "tree of 8 skipped: $(tail -1 "$scratch/err")" >&2
        exit 0
    fi
    error_pct "$scratch/tree.json" cgroup
done >"$scratch/tree.txt"
echo "tree of 8 x $per_child MiB: sampled - cgroup peak, % of cgroup peak (median of $RUNS): $(cut -d' ' -f1 "$scratch/tree.txt" | median)"
