#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser and decoder: each cargo-fuzz target under fuzz/
# (bodies in crates/headroom-fuzz) runs under libFuzzer for SECONDS_PER_TARGET seconds, from
# its committed seeds (fuzz/corpus/<target>) and the inputs that once crashed it
# (fuzz/regressions/<target>), then a Markdown table says how many inputs each one tried.
#
# Stable Rust is enough: `--sanitizer none` drops AddressSanitizer, the one part of cargo-fuzz
# that needs nightly (-Zsanitizer), and keeps libFuzzer, the coverage instrumentation, and
# debug assertions with overflow checks. headroom's parsers are safe Rust, so a crash is a
# panic, an overflow, a timeout or running out of memory, which all still show.
#
# cargo-fuzz is installed once into ROOT/bin (default ~/.cache/headroom-fuzz, which CI
# caches). What a run finds stays in fuzz/target/fuzz-run/<target>/: `corpus` (the inputs
# that reached new code) and `artifacts` (crash-*, timeout-*, oom-* inputs). Copy a crashing
# input into fuzz/regressions/<target>/, fix it, and `cargo test -p headroom-fuzz` keeps it
# fixed.
#
# Usage: bench/fuzz.sh [TARGET...]     (from anywhere; all targets when none are named)
#        SECONDS_PER_TARGET=300 nice -n 19 bench/fuzz.sh sizes settings
# Exits 1 when any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${SECONDS_PER_TARGET:-60}
root=${HEADROOM_FUZZ_ROOT:-$HOME/.cache/headroom-fuzz}
cargo_fuzz_version=0.13.2
export PATH="$root/bin:$PATH"
export CARGO_INCREMENTAL=0
# The targets that read files (bundles, cache entries, response files) make a scratch folder
# per input; on tmpfs that costs a tenth of what it costs on a disk that discards on delete.
if [[ -z "${TMPDIR:-}" && -d /dev/shm && -w /dev/shm ]]; then
  export TMPDIR=/dev/shm
fi

if [[ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $cargo_fuzz_version" ]]; then
  cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked --root "$root"
fi

if (($#)); then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi
# The main workspace's lockfile pins every version the targets share with headroom; cargo
# adds libfuzzer-sys to the copy.
cp Cargo.lock fuzz/Cargo.lock
# Same flags for build and run, so that `run` finds the build up to date.
flags=(--sanitizer none)
cargo fuzz build "${flags[@]}" >&2

work=fuzz/target/fuzz-run
rows=()
crashed=0
for target in "${targets[@]}"; do
  dir="$work/$target"
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts" "fuzz/regressions/$target"
  echo "fuzz.sh: $target for ${seconds}s" >&2
  # New inputs go into the first folder; the committed seeds and regressions are only read.
  # -timeout: one input taking 30 s is a hang; -rss_limit_mb: libFuzzer's default, named.
  set +e
  cargo fuzz run "${flags[@]}" "$target" "$dir/corpus" "fuzz/corpus/$target" \
    "fuzz/regressions/$target" -- \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" >"$dir/log" 2>&1
  status=$?
  set -e
  # A run that failed before fuzzing prints neither figure.
  inputs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$dir/log" | tail -1 || true)
  corpus=$(grep -oP '\bcorp: \K[0-9]+' "$dir/log" | tail -1 || true)
  found=$(find "$dir/artifacts" -type f | wc -l)
  if ((status != 0 || found > 0)); then
    crashed=1
    echo "fuzz.sh: $target failed (exit $status); log: $dir/log" >&2
    find "$dir/artifacts" -type f -printf '  %p\n' >&2
    tail -n 30 "$dir/log" >&2
    ((found > 0)) || found="? (exit $status)"
  fi
  rows+=("| $target | $seconds | ${inputs:-?} | ${corpus:-?} | $found |")
done

echo "| target | seconds | inputs tried | corpus | crashes |"
echo "|---|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
exit "$crashed"
