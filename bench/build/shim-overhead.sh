#!/usr/bin/env bash
# Shim overhead per compiler invocation: the same command run through headroom's shim (under a
# live governor) and directly, side by side in one hyperfine run, inside one `headroom build`.
# Two compilers: `true` (the overhead alone) and g++ on a trivial unit (what a build sees).
# Usage: bench/build/shim-overhead.sh [RUNS]   (needs hyperfine and a release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-300}
headroom=${HEADROOM:-$PWD/target/release/headroom}
command -v hyperfine >/dev/null || { echo "needs hyperfine (apt-get install hyperfine)"; exit 2; }
[ -x "$headroom" ] || { echo "needs $headroom: cargo build --release -p headroom"; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HEADROOM_STATE_DIR=$work/state
echo 'int main() { return 0; }' > "$work/trivial.cpp"
ln -s "$(type -P true)" "$work/cc"   # a "compiler" that does nothing: `cc` is shimmed
cat > "$work/inner.sh" <<INNER
set -e
cd "$work"
hyperfine -N --warmup 20 --runs $runs --export-json true.json \
  -n direct "$work/cc" -n shim "cc"
hyperfine -N --warmup 5 --runs $((runs / 5)) --export-json gpp.json \
  -n direct "$(command -v g++) -c trivial.cpp -o trivial.o" -n shim "g++ -c trivial.cpp -o trivial.o"
INNER
PATH="$work:$PATH" "$headroom" build --no-history -- bash "$work/inner.sh" >/dev/null

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
for name, label in (("true.json", "`true` (overhead alone)"), ("gpp.json", "g++ -c trivial.cpp")):
    results = {r["command"]: r for r in json.load(open(f"{work}/{name}"))["results"]}
    direct, shim = results["direct"]["median"] * 1e3, results["shim"]["median"] * 1e3
    print(f"| {label} | {direct:.2f} ms | {shim:.2f} ms | {shim - direct:+.2f} ms | {shim / direct:.2f}× |")
PY
