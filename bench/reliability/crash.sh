#!/usr/bin/env bash
# Crash consistency: SIGKILLs `headroom build` and `headroom kernels build` at POINTS random
# points (default 200, half each command; the CLI, the governor, a shim or a compiler), a
# share of them inside a write, and prints what survived: kills by target, kills that landed
# mid-write, corrupted caches and histories, leftover stopped processes and temp files.
# The harness is the test crates/headroom/tests/crash.rs, which CI runs with 20 points.
# Usage: bench/reliability/crash.sh [POINTS] [SEED]   (needs make and clang-19)
set -euo pipefail
cd "$(dirname "$0")/../.."
export HEADROOM_CRASH_POINTS=${1:-200}
[ -n "${2:-}" ] && export HEADROOM_CRASH_SEED=$2
exec cargo test --release -p headroom --test crash -- --nocapture
