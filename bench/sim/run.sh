#!/usr/bin/env bash
# Reproduces the `headroom sim` tables of BENCHMARKS.md: every synthetic trace on the large
# machines, the recorded traces on the 2-core machine they were recorded on.
# Usage: bench/sim/run.sh [OUTPUT-DIR]   (default target/sim-bench)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/sim-bench}
mkdir -p "$out"
cargo build --release -p headroom
headroom=target/release/headroom

"$headroom" sim traces/*.json --machine 16c/32G,64c/128G,192c/1T \
    --json --html "$out/synthetic.html" > "$out/synthetic.json"
python3 bench/sim/table.py "$out/synthetic.json"

if compgen -G "traces/recorded/*.json" > /dev/null; then
    echo
    "$headroom" sim traces/recorded/*.json --machine 2c/24G,16c/32G \
        --json --html "$out/recorded.html" > "$out/recorded.json"
    python3 bench/sim/table.py "$out/recorded.json"
fi
echo "full tables: $headroom sim ... (without --json); charts: $out/*.html" >&2
