#!/usr/bin/env bash
# Alloc/free pairs per second of headroom-mem's caching pool on 1, 2, 4 and 8 threads,
# against the system allocator in the same run (see crates/headroom-mem/examples/pairs.rs).
# Extra arguments go to the benchmark, e.g. `bench/mem/threads.sh --reps 9 --json`.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --quiet -p headroom-mem --example pairs
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
"${CARGO_TARGET_DIR:-target}/release/examples/pairs" "$@"
