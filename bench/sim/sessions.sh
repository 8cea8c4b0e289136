#!/usr/bin/env bash
# Several builds at once on one machine, as sessions of headroom (`headroom sim --sessions N`):
# one governor that every session joins against one governor per session, each sure that the
# whole budget and every core are its own (as two `headroom build`s ran before they shared a
# governor), with one session over the union of the builds as the yardstick. 2 and 4 sessions
# of traces/flash-attention.json and traces/lto-links.json taken in turn, on a 16-core, 32 GiB
# machine and an 8-core, 16 GiB one, headroom cold and warm.
# Writes OUTPUT-DIR/sessions-N.json (every outcome) and OUTPUT-DIR/sessions.md (the table).
# Usage: bench/sim/sessions.sh OUTPUT-DIR   (HEADROOM=path/to/headroom skips the release build)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
output_dir "bench/sim/sessions.sh OUTPUT-DIR" "$@"
cd "$(dirname "$0")/../.."
release_headroom

for sessions in 2 4; do
    "$headroom" sim --sessions "$sessions" traces/flash-attention.json traces/lto-links.json \
        --machine 16c/32G,8c/16G --policy headroom,headroom-warm --json \
        > "$out/sessions-$sessions.json"
done
python3 bench/sim/sessions_table.py "$out"/sessions-2.json "$out"/sessions-4.json \
    > "$out/sessions.md"
cat "$out/sessions.md"
