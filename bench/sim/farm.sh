#!/usr/bin/env bash
# The farm scaling table of BENCHMARKS.md: a flash-attention-sized build
# (traces/flash-attention.json: 48 nvcc jobs at 4.2-4.8 GB) from a 16-core, 32 GiB workstation
# with a farm of 1 to 64 nodes of the same form, headroom's placement against sccache-dist's
# and icecream's own (each at -j the farm's slots).
# Writes OUTPUT-DIR/farm.json (every outcome) and OUTPUT-DIR/farm.md (the table).
# Usage: bench/sim/farm.sh OUTPUT-DIR   (HEADROOM=path/to/headroom skips the release build)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
output_dir "bench/sim/farm.sh OUTPUT-DIR" "$@"
cd "$(dirname "$0")/../.."
release_headroom

machine=16c/32G
node=16c/32G
farms=""
for nodes in 1 2 4 8 16 32 64; do
    farms="$farms${farms:+,}${nodes}x$node"
done
"$headroom" sim traces/flash-attention.json --machine "$machine" --farm "$farms" \
    --policy headroom,headroom-warm,sccache-dist,icecream --json > "$out/farm.json"
python3 bench/sim/farm_table.py "$out/farm.json" > "$out/farm.md"
cat "$out/farm.md"
