#!/usr/bin/env bash
# The cost of interception, on a quiet host and on a host loaded by another build, each
# measured side by side inside one live `headroom build` (interceptor preloaded, governor
# listening):
#   - per compiler call: the same compiler run by a name the interceptor governs (`cc`,
#     `g++`) and by a name it lets through (`direct-true`, `direct-gxx`), both links to the
#     same program: `true` (the overhead alone), back to back and 100 ms apart as a build's
#     calls come, and g++ on a trivial unit (what a build sees);
#   - per exec of a program that is not a compiler (quiet host only): a shell loop of 1,000
#     `/bin/true`, with the interceptor preloaded and with LD_PRELOAD removed. `true` never
#     starts a program, so it starts without the interceptor; `nproc` is not on that list and
#     loads it, as any program that might start a compiler does;
#   - the floor (quiet and busy): one start of a static glibc `true` against one of a `true`
#     built without a C library (nolibc-true.c): the difference is glibc's own start-up on
#     this host, which a shim built for glibc pays on every compiler call.
#   - with GLIBC_SHIM=path (a shim built for glibc: `cargo build --release -p headroom-shim`),
#     the shim headroom carries against that one, both governed, side by side.
# Each pair runs alternated (alternate.py), with the build's history on, as a build has it.
# The load is a plain `make -j2` of examples/template-heavy's light units, rebuilt in a loop
# outside headroom from before the loaded rows start until they end.
# Usage: [GLIBC_SHIM=path] bench/build/interception-cost.sh [RUNS]
#   (needs python3, make, cc, g++, a release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-300}
headroom=${HEADROOM:-$PWD/target/release/headroom}
[ -x "$headroom" ] || { echo "needs $headroom: cargo build --release -p headroom"; exit 2; }

work=$(mktemp -d)
load_pid=
stop_load() {
  if [ -n "$load_pid" ]; then
    kill -- "-$load_pid" 2>/dev/null || true
    wait "$load_pid" 2>/dev/null || true
    load_pid=
  fi
}
trap 'stop_load; rm -rf "$work"' EXIT
export HEADROOM_STATE_DIR=$work/state
echo 'int main() { return 0; }' > "$work/trivial.cpp"
true_bin=$(type -P true)
gxx=$(readlink -f "$(type -P g++)")
ln -s "$true_bin" "$work/cc"
ln -s "$true_bin" "$work/direct-true"
ln -s "$gxx" "$work/g++"
ln -s "$gxx" "$work/direct-gxx"
echo 'int main(void) { return 0; }' > "$work/glibc-true.c"
cc -O2 -static -o "$work/glibc-true" "$work/glibc-true.c"
cc -O2 -nostdlib -static -o "$work/nolibc-true" bench/build/nolibc-true.c
cp -r examples/template-heavy "$work/load"
bench=$PWD/bench/build

# inner.sh PHASE [exec]: the compiler rows, and with `exec` the rows of other execs.
cat > "$work/inner.sh" <<INNER
set -e
cd "$work"
phase=\$1
python3 "$bench/alternate.py" $runs \$phase-true.json direct="$work/direct-true" governed="$work/cc"
GAP_MS=100 python3 "$bench/alternate.py" $((runs / 3 + 1)) \$phase-true-apart.json \
  direct="$work/direct-true" governed="$work/cc"
python3 "$bench/alternate.py" $runs \$phase-gpp.json \
  direct="$work/direct-gxx -c trivial.cpp -o trivial.o" governed="$work/g++ -c trivial.cpp -o trivial.o"
python3 "$bench/alternate.py" $runs \$phase-floor.json \
  direct-unpreloaded="$work/nolibc-true" governed-unpreloaded="$work/glibc-true"
if [ -n "${GLIBC_SHIM:-}" ]; then
  carried=\$(readlink "\$HEADROOM_STATE_DIR/shims/headroom-launch")
  mkdir -p glibc-shim carried-shim
  ln -sf "${GLIBC_SHIM:-}" glibc-shim/headroom-launch
  ln -sf "\$carried" carried-shim/headroom-launch
  python3 "$bench/alternate.py" $runs \$phase-shims.json \
    direct="$work/glibc-shim/headroom-launch $work/direct-true" \
    governed="$work/carried-shim/headroom-launch $work/direct-true"
fi
[ "\${2:-}" = exec ] || exit 0
python3 "$bench/alternate.py" $((runs / 10 + 5)) \$phase-exec.json \
  direct-unpreloaded="sh -c 'for i in \\\$(seq 1000); do /bin/true; done'" \
  governed="sh -c 'for i in \\\$(seq 1000); do /bin/true; done'"
python3 "$bench/alternate.py" $((runs / 10 + 5)) \$phase-exec-loading.json \
  direct-unpreloaded="sh -c 'for i in \\\$(seq 1000); do nproc >/dev/null; done'" \
  governed="sh -c 'for i in \\\$(seq 1000); do nproc >/dev/null; done'"
INNER

load_average() { cut -d' ' -f1-3 /proc/loadavg; }
echo "quiet: load average before $(load_average)"
"$headroom" build -- bash "$work/inner.sh" quiet exec >/dev/null 2>&1
echo "quiet: load average after $(load_average)"
# The loading build runs in a process group of its own, which stop_load ends whole.
setsid bash -c 'cd "$1" && while :; do make -s -j2 HEAVY=0 LIGHT=8 >/dev/null 2>&1; make -s clean >/dev/null; done' \
  load "$work/load" &
load_pid=$!
sleep 5
echo "busy: load average before $(load_average)"
"$headroom" build -- bash "$work/inner.sh" busy >/dev/null 2>&1
echo "busy: load average after $(load_average)"
stop_load

python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
rows = (("true", "`true` by a compiler's name (overhead alone)", 1, "ms", 1e3),
        ("true-apart", "the same, calls 100 ms apart (as a build's)", 1, "ms", 1e3),
        ("gpp", "g++ -c trivial.cpp (`int main(){}`)", 1, "ms", 1e3),
        ("exec", "one exec of `/bin/true` (loop of 1,000)", 1000, "µs", 1e6),
        ("exec-loading", "one exec of `nproc`, which loads the interceptor (loop of 1,000)",
         1000, "µs", 1e6),
        ("floor", "floor: a program's start, without a C library (direct) and with static "
         "glibc (governed column); neither is a compiler", 1, "ms", 1e3),
        ("shims", "`true` through a shim built for glibc (direct column) and through the shim "
         "headroom carries (governed column), both governed", 1, "ms", 1e3))
print("| host | what | direct | governed | overhead | ratio |")
print("|---|---|---:|---:|---:|---:|")
for phase in ("quiet", "busy"):
    for name, label, per, unit, scale in rows:
        path = f"{work}/{phase}-{name}.json"
        if not os.path.exists(path):
            continue
        results = {r["command"].removesuffix("-unpreloaded"): r
                   for r in json.load(open(path))["results"]}
        direct = results["direct"]["median"] * scale / per
        governed = results["governed"]["median"] * scale / per
        print(f"| {phase} | {label} | {direct:.2f} {unit} | {governed:.2f} {unit} | "
              f"{governed - direct:+.2f} {unit} | {governed / direct:.2f}× |")
PY
