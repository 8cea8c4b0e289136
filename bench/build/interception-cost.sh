#!/usr/bin/env bash
# The cost of interception, side by side in one hyperfine run each, inside one live
# `headroom build` (interceptor preloaded, governor listening):
#   - per compiler call: the same compiler run by a name the interceptor governs (`cc`,
#     `g++`) and by a name it lets through (`direct-true`, `direct-gxx`), both links to the
#     same program: `true` (the overhead alone) and g++ on a trivial unit (what a build sees);
#   - per exec of a program that is not a compiler: a shell loop of 1,000 `/bin/true`, with
#     the interceptor preloaded and with LD_PRELOAD removed. `true` never starts a program,
#     so it starts without the interceptor; `nproc` is not on that list and loads it, as any
#     program that might start a compiler does.
# Each pair runs alternated (alternate.py), with the build's history on, as a build has it.
# Usage: bench/build/interception-cost.sh [RUNS]   (needs python3 and a release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-300}
headroom=${HEADROOM:-$PWD/target/release/headroom}
[ -x "$headroom" ] || { echo "needs $headroom: cargo build --release -p headroom"; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HEADROOM_STATE_DIR=$work/state
echo 'int main() { return 0; }' > "$work/trivial.cpp"
true_bin=$(type -P true)
gxx=$(readlink -f "$(type -P g++)")
ln -s "$true_bin" "$work/cc"
ln -s "$true_bin" "$work/direct-true"
ln -s "$gxx" "$work/g++"
ln -s "$gxx" "$work/direct-gxx"
bench=$PWD/bench/build
cat > "$work/inner.sh" <<INNER
set -e
cd "$work"
python3 "$bench/alternate.py" $runs true.json direct="$work/direct-true" governed="$work/cc"
python3 "$bench/alternate.py" $runs gpp.json \
  direct="$work/direct-gxx -c trivial.cpp -o trivial.o" governed="$work/g++ -c trivial.cpp -o trivial.o"
python3 "$bench/alternate.py" $((runs / 10 + 5)) exec.json \
  direct-unpreloaded="sh -c 'for i in \\\$(seq 1000); do /bin/true; done'" \
  governed="sh -c 'for i in \\\$(seq 1000); do /bin/true; done'"
python3 "$bench/alternate.py" $((runs / 10 + 5)) exec-loading.json \
  direct-unpreloaded="sh -c 'for i in \\\$(seq 1000); do nproc >/dev/null; done'" \
  governed="sh -c 'for i in \\\$(seq 1000); do nproc >/dev/null; done'"
INNER
"$headroom" build -- bash "$work/inner.sh" >/dev/null 2>&1

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
rows = (("true.json", "`true` by a compiler's name (overhead alone)", 1, "ms", 1e3),
        ("gpp.json", "g++ -c trivial.cpp (`int main(){}`)", 1, "ms", 1e3),
        ("exec.json", "one exec of `/bin/true` (loop of 1,000)", 1000, "µs", 1e6),
        ("exec-loading.json", "one exec of `nproc`, which loads the interceptor (loop of 1,000)",
         1000, "µs", 1e6))
for name, label, per, unit, scale in rows:
    results = {r["command"].removesuffix("-unpreloaded"): r
               for r in json.load(open(f"{work}/{name}"))["results"]}
    direct = results["direct"]["median"] * scale / per
    governed = results["governed"]["median"] * scale / per
    print(f"| {label} | {direct:.2f} {unit} | {governed:.2f} {unit} | "
          f"{governed - direct:+.2f} {unit} | {governed / direct:.2f}× |")
PY
