#!/usr/bin/env bash
# Governor footprint during a 1,000-job build: peak RSS and CPU time of the governor process,
# and the build's wall time against the same make run without headroom, side by side.
# Jobs are `headroom-fakecc --mem 8 --ms 20` (a short compile that touches 8 MiB).
# Usage: bench/build/governor-footprint.sh [JOBS]
#   (needs `cargo build --release -p headroom -p headroom-fakecc`)
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/lib.sh
jobs=${1:-1000}
headroom=${HEADROOM:-$PWD/target/release/headroom}
fakecc=${FAKECC:-$PWD/target/release/headroom-fakecc}
[ -x "$headroom" ] && [ -x "$fakecc" ] || { echo "needs cargo build --release -p headroom -p headroom-fakecc"; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
ln -s "$fakecc" "$work/bin/g++"
{
  echo '.PHONY: all'
  printf 'all:'; for i in $(seq "$jobs"); do printf ' o%d.o' "$i"; done; echo
  echo '%.o:'; printf '\tg++ --mem 8 --ms 20 -c $*.cpp -o $@\n'
} > "$work/Makefile"
export PATH="$work/bin:$PATH" HEADROOM_STATE_DIR=$work/state
cpus=$(nproc)

start=$(date +%s.%N)
make -s -C "$work" -j"$cpus" >/dev/null
plain=$(echo "$(date +%s.%N) - $start" | bc)
rm -f "$work"/*.o

ticks=$(getconf CLK_TCK)
start=$(date +%s.%N)
(cd "$work" && exec "$headroom" build -- make -s -j"$cpus" 2>"$work/summary") &
build=$!
gov=""
while [ -z "$gov" ] && kill -0 $build 2>/dev/null; do gov=$(governor_of $build); sleep 0.02; done
hwm=0; cpu=0
while [ -n "$gov" ] && [ -r /proc/$gov/status ]; do
  h=$(awk '/VmHWM/ {print $2}' /proc/$gov/status 2>/dev/null || echo 0)
  c=$(awk '{print $14 + $15}' /proc/$gov/stat 2>/dev/null || echo 0)
  [ -n "$h" ] && [ "$h" -gt "$hwm" ] && hwm=$h
  [ -n "$c" ] && [ "$c" -gt "$cpu" ] && cpu=$c
  sleep 0.1
done
wait $build
governed=$(echo "$(date +%s.%N) - $start" | bc)
cpu_s=$(echo "scale=2; $cpu / $ticks" | bc)
echo "| $jobs jobs, make -j$cpus | plain ${plain}s | headroom ${governed}s | ratio $(echo "scale=3; $governed / $plain" | bc)× | governor peak RSS $((hwm / 1024)) MiB | governor CPU ${cpu_s}s ($(echo "scale=1; 100 * $cpu_s / $governed" | bc)% of one core) |"
tail -3 "$work/summary" >&2
