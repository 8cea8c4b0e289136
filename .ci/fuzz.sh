#!/usr/bin/env bash
# CI's short fuzzing pass: every cargo-fuzz target for 10 s on the stable toolchain, after
# installing cargo-fuzz into ~/.cache/headroom-fuzz if it is missing (cache that folder). The
# corpora and regression inputs are also replayed by `cargo test --workspace`
# (crates/headroom-fuzz/tests/replay.rs); this pass looks for new crashes.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${SECONDS_PER_TARGET:-10} exec bash bench/fuzz.sh "$@"
