#!/usr/bin/env bash
# Builds, on a machine without a GPU, everything bench/mem/gpu.sh runs on one, into
# target/gpu-carry (about 10 MB): the headroom-mem wheel (with the `cuda` feature, as every
# wheel has), the crate's integration-test binary built with `cuda` (gpu.sh runs its `cuda::`
# tests), and the pairs benchmark built with `cuda`.
#
#   bash bench/mem/gpu-prepare.sh && <copy the tree with target/gpu-carry to the GPU machine>
#   bash bench/mem/gpu.sh target/gpu-carry OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
target="${CARGO_TARGET_DIR:-target}"
carry="$target/gpu-carry"
rm -rf "$carry" && mkdir -p "$carry"

maturin="${HEADROOM_WHEEL_CACHE:-$HOME/.cache/headroom-wheel}/maturin/bin/maturin"
[ -x "$maturin" ] || { echo "gpu-prepare.sh: no maturin at $maturin; run bash .ci/wheel.sh once" >&2; exit 1; }
"$maturin" build --release --quiet -m crates/headroom-mem-py/Cargo.toml --out "$carry"

cargo build --release --quiet -p headroom-mem --features cuda --example pairs
cp "$target/release/examples/pairs" "$carry/pairs"
tests=$(cargo test --release --quiet -p headroom-mem --features cuda --test integration --no-run --message-format=json |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "integration":
        print(m["executable"])')
cp "$tests" "$carry/cuda-tests"
ls -la "$carry"
