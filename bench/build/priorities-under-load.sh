#!/usr/bin/env bash
# CPU priorities on a machine that is not the build's alone: the bundled example
# (examples/template-heavy, `make HEAVY=2 LIGHT=6 check`) beside two unrelated CPU-bound
# processes (`yes > /dev/null` at niceness 0, each in a session of its own), then on an idle
# machine. Plain `make -j2`
# against a warm `headroom build -- make`, whose priorities are niceness inside a CPU cgroup
# of its own where one can be made, and against the same with HEADROOM_CPU_CGROUP=0, where
# that niceness also yields to the unrelated processes. One cold headroom build under
# load teaches headroom the jobs; then the three builds alternate, REPEATS times. Prints each
# build's wall time and the medians with their ratios to plain make.
# Usage: bench/build/priorities-under-load.sh [REPEATS]   (default 3; about 25 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
repeats=${1:-3}
cargo build --release -p headroom
root=$(pwd)
work=$(mktemp -d)
busy=()
stop_busy() {
    for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done
    busy=()
}
trap 'stop_busy; rm -rf "$work"' EXIT
cp -r examples/template-heavy "$work/src"
export HEADROOM_STATE_DIR="$work/state"
vars=(HEAVY=2 LIGHT=6)
# Prints the wall time of `make clean` then COMMAND… in the example, in seconds.
timed() {
    (cd "$work/src" && make clean >/dev/null)
    local start end
    start=$(date +%s.%N)
    (cd "$work/src" && "$@" >/dev/null 2>&1)
    end=$(date +%s.%N)
    python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$end"
}
plain() { timed make -j2 "${vars[@]}" check; }
governed() { timed "$root/target/release/headroom" build -- make "${vars[@]}" check; }
niced() { HEADROOM_CPU_CGROUP=0 governed; }
# Runs every build REPEATS times, alternating; prints them and the medians, labelled $1.
compare() {
    local label=$1 builds=$2
    local -A times=()
    for run in $(seq "$repeats"); do
        local line="$label run $run:"
        for build in $builds; do
            local t
            t=$($build)
            times[$build]+="$t "
            line+=" $build $t s"
        done
        echo "$line"
    done
    local args=()
    for build in $builds; do args+=("$build" "${times[$build]}"); done
    python3 - "$label" "${args[@]}" <<'PY'
import statistics, sys
label, rest = sys.argv[1], sys.argv[2:]
medians = {rest[i]: statistics.median(float(x) for x in rest[i + 1].split()) for i in range(0, len(rest), 2)}
base = medians["plain"]
print(f"{label} medians: " + ", ".join(f"{name} {m:.1f} s ({m / base:.3f}x plain)" for name, m in medians.items()))
PY
}
# Each in a session of its own, as unrelated work is: where the kernel schedules the root
# cgroup's processes by session (autogroup), work in the build's session is not unrelated.
for _ in 1 2; do
    setsid yes > /dev/null &
    busy+=($!)
done
governed > /dev/null   # cold: learns the jobs and their paths
compare "loaded" "plain governed niced"
stop_busy
compare "idle" "plain governed"
