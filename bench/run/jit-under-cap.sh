#!/usr/bin/env bash
# jit-under-cap.sh: why this script exists
#
# Compilation is moving into running programs (torch.compile's workers, Triton and TileLang
# JITs). `headroom run` governs the compilers such a program starts. This script measures
# that against the program run plain, side by side: a JIT-style Python program compiles UNITS
# heavy units of examples/template-heavy at once in a `multiprocessing` pool, each with the
# real g++ (about UNIT_MIB of compiler memory each), inside a fresh memory cgroup of CAP that
# holds only some of them at once. Plain, the kernel OOM-kills compilers; under
# `headroom run`, they are admitted as the budget allows. A third row runs the program plain
# with a pool of SAFE, the size a user who knows the cap would pick by hand. Each row is run REPEATS times,
# interleaved; the table shows medians of wall time, exit status and OOM kills.
#
# Usage (as root or from a delegated cgroup; cgroup v1 or v2):
#   bench/run/jit-under-cap.sh
#   CAP=2G UNITS=4 UNIT_MIB=700 REPEATS=3 bench/run/jit-under-cap.sh
#
# Environment (all optional):
#   CAP=1.5G        the cgroup's memory limit (binary units)
#   UNITS=4         units the pool compiles, all at once
#   UNIT_MIB=600    the compiler memory each unit aims at (template-heavy's TARGET_MIB)
#   REPEATS=3       runs of each row; the table shows medians
#   SAFE=2          the pool size of the row that a user who knows the cap would pick
#   HEADROOM=path   the headroom binary (default target/release/headroom, else target/debug)
set -euo pipefail

script_name=jit-under-cap.sh
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/../.." && pwd)
CAP=${CAP:-1.5G}
UNITS=${UNITS:-4}
UNIT_MIB=${UNIT_MIB:-600}
REPEATS=${REPEATS:-3}
SAFE=${SAFE:-2}
HEADROOM=${HEADROOM:-$repo_root/target/release/headroom}
[[ -x $HEADROOM ]] || HEADROOM=$repo_root/target/debug/headroom

# shellcheck source=bench/build/cgroups.sh
source "$repo_root/bench/build/cgroups.sh"
[[ -x $HEADROOM ]] || die "no headroom binary at $HEADROOM: run 'cargo build --release -p headroom --bins' or set HEADROOM"
command -v python3 >/dev/null || skip "python3 is not installed"
command -v g++ >/dev/null || skip "g++ is not installed"
setup_cgroups
work_dir=$(mktemp -d)
trap cleanup EXIT
cap_bytes=$(size_to_bytes "$CAP")

# The JIT-style program: a pool that compiles every unit at once (or as many at once as its
# argument says), exiting with the worst code.
cat >"$work_dir/prog.py" <<EOF
import multiprocessing, subprocess, sys

def compile_unit(i):
    return subprocess.run([
        "g++", "-std=c++17", "--param", "ggc-min-expand=100", "--param", "ggc-min-heapsize=131072",
        "-O2", f"-DUNIT_NAME=jit_{i}", "-DTARGET_MIB=$UNIT_MIB",
        "-I", "$repo_root/examples/template-heavy",
        "-c", "$repo_root/examples/template-heavy/unit.cpp", "-o", f"jit_{i}.o",
    ]).returncode

if __name__ == "__main__":
    at_once = int(sys.argv[1]) if len(sys.argv) > 1 else $UNITS
    with multiprocessing.Pool(at_once) as pool:
        codes = pool.map(compile_unit, range($UNITS))
    sys.exit(max(codes))
EOF

csv=$work_dir/runs.csv
echo "repeat,row,wall_s,exit,oom_kills" >"$csv"

# Runs one row in a fresh cgroup of CAP and appends its CSV line.
run_row() {
  local repeat=$1 row=$2 start end status=0
  shift 2
  make_cgroup "$cap_bytes"
  rm -f "$work_dir"/*.o
  start=$(date +%s.%N)
  HEADROOM_STATE_DIR=$work_dir/state bash -c 'echo $$ >"$1/cgroup.procs" && cd "$2" && shift 2 && exec "$@"' \
    jit-run "$cgroup" "$work_dir" "$@" >"$work_dir/$row-$repeat.log" 2>&1 || status=$?
  end=$(date +%s.%N)
  echo "$repeat,$row,$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }'),$status,$(cgroup_oom_kills "$cgroup")" >>"$csv"
  log "repeat $repeat: $row exit $status, $(tail -n1 "$csv" | cut -d, -f3) s, OOM kills $(cgroup_oom_kills "$cgroup")"
}

log "cgroup v$cgroup_version, cap $CAP, $UNITS units of ~$UNIT_MIB MiB at once, $REPEATS repeats, $HEADROOM"
for repeat in $(seq 1 "$REPEATS"); do
  run_row "$repeat" plain python3 prog.py
  run_row "$repeat" "plain (pool of $SAFE)" python3 prog.py "$SAFE"
  run_row "$repeat" "headroom run" "$HEADROOM" run -- python3 prog.py
done

python3 - "$csv" "$CAP" "$UNITS" "$UNIT_MIB" <<'EOF'
import csv, statistics, sys
path, cap, units, unit_mib = sys.argv[1:]
rows = {}
for run in csv.DictReader(open(path)):
    rows.setdefault(run["row"], []).append(run)
print(f"\n{units} units of ~{unit_mib} MiB compiled at once by a multiprocessing pool, cgroup cap {cap}; medians of {len(next(iter(rows.values())))}\n")
print("| command | wall (s) | exit | OOM kills | runs that exited 0 |")
print("|---|---|---|---|---|")
walls = {}
for row, runs in rows.items():
    walls[row] = statistics.median(float(r["wall_s"]) for r in runs)
    exits = statistics.median(int(r["exit"]) for r in runs)
    ooms = statistics.median(int(r["oom_kills"]) for r in runs if r["oom_kills"] != "n/a")
    ok = sum(r["exit"] == "0" for r in runs)
    print(f"| {row} | {walls[row]:.1f} | {exits:g} | {ooms:g} | {ok}/{len(runs)} |")
for row, wall in walls.items():
    if row != "headroom run" and wall > 0:
        print(f"wall ratio headroom run / {row}: {walls['headroom run'] / wall:.2f}")
EOF
