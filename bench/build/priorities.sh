#!/usr/bin/env bash
# CPU priorities on the real kernel: a chain of three single-threaded jobs (each needs the one
# before it) beside four two-threaded jobs that nothing waits for, on a 2-core machine. The
# jobs are headroom-fakecc burning real CPU time, so only the kernel's scheduler decides how
# fast each runs. One cold build teaches headroom the chain; then warm builds alternate with
# and without --no-priorities, same history, same order. Prints each build's wall time and
# the medians.
# Usage: bench/build/priorities.sh [REPEATS]   (default 5; about 2 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
repeats=${1:-5}
cargo build --release -p headroom -p headroom-fakecc
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
ln -s "$root/target/release/headroom-fakecc" "$work/bin/g++"
cat > "$work/Makefile" <<'MAKEFILE'
all: c3.o s1.o s2.o s3.o s4.o
c1.o:
	g++ --cpu-ms 3000 -c c1.cpp -o c1.o
c2.o: c1.o
	g++ --cpu-ms 3000 -c c2.cpp c1.o -o c2.o
c3.o: c2.o
	g++ --cpu-ms 3000 -c c3.cpp c2.o -o c3.o
s%.o:
	g++ --cpu-ms 2000 --threads 2 -c s$*.cpp -o $@
MAKEFILE
export HEADROOM_STATE_DIR="$work/state" PATH="$work/bin:$PATH"
build() {
    rm -f "$work"/*.o
    (cd "$work" && "$root/target/release/headroom" build "$@" --report report.json -- make -j8 >/dev/null 2>&1)
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["build"]["duration_ms"] / 1000)' "$work/report.json"
}
build > /dev/null   # cold: learns the jobs and the chain
with=() without=()
for run in $(seq "$repeats"); do
    with+=("$(build)")
    without+=("$(build --no-priorities)")
    echo "run $run: priorities ${with[-1]} s, --no-priorities ${without[-1]} s"
done
python3 - "${with[*]}" "${without[*]}" <<'PY'
import statistics, sys
with_, without = ([float(x) for x in arg.split()] for arg in sys.argv[1:])
a, b = statistics.median(with_), statistics.median(without)
print(f"median: priorities {a:.2f} s, --no-priorities {b:.2f} s, ratio {a / b:.3f}")
PY
