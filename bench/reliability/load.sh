#!/usr/bin/env bash
# Load: BUILDS concurrent `headroom build` runs sharing one history, JOBS trivial fake compiles
# each (default 8 × 2,500 = 20,000): rows recorded against jobs run, failed or warning builds,
# each governor's peak RSS. Then one 10,000-job build: the governor's CPU time, its share of a
# core over the build's wall time, and its peak RSS (bench/build/governor-footprint.sh).
# The concurrent part is the test crates/headroom/tests/load.rs, which CI runs at 4 × 200.
# Usage: bench/reliability/load.sh [BUILDS] [JOBS] [SINGLE_BUILD_JOBS]
set -euo pipefail
cd "$(dirname "$0")/../.."
HEADROOM_LOAD_BUILDS=${1:-8} HEADROOM_LOAD_JOBS=${2:-2500} \
  cargo test --release -p headroom --test load -- --nocapture
cargo build --release -p headroom -p headroom-fakecc
bench/build/governor-footprint.sh "${3:-10000}"
