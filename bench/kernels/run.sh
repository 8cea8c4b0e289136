#!/usr/bin/env bash
# Benchmarks of `headroom kernels` through the release binary (needs clang-19 and hyperfine):
#   1. no-op rebuild of 50 kernels x 6 targets (target <= 50 ms),
#   2. cold build of 10 kernels x 6 targets, serial (-j1) against parallel (-j2),
#   3. export -> import -> export round trip, checked byte-identical.
# The in-process numbers (resolve, no-op rebuild) come from
#   cargo bench -p headroom-kernels --bench kernels
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p headroom
headroom=$PWD/target/release/headroom
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

medians() { python3 bench/kernels/medians.py "$1"; }

echo "== no-op rebuild, 50 kernels x 6 targets"
bench/kernels/gen_project.sh "$work/p50" 50
"$headroom" kernels --manifest "$work/p50/kernels.toml" --cache "$work/c50" build -j2 >/dev/null
hyperfine --warmup 3 --runs 30 --export-json "$work/noop.json" \
  "$headroom kernels --manifest $work/p50/kernels.toml --cache $work/c50 build"
medians "$work/noop.json"

echo "== cold build, 10 kernels x 6 targets: serial vs parallel"
bench/kernels/gen_project.sh "$work/p10" 10
hyperfine --runs 5 --prepare "rm -rf $work/c10" --export-json "$work/cold.json" \
  "$headroom kernels --manifest $work/p10/kernels.toml --cache $work/c10 build -j1" \
  "$headroom kernels --manifest $work/p10/kernels.toml --cache $work/c10 build -j2"
medians "$work/cold.json"

echo "== export/import round trip"
"$headroom" kernels --cache "$work/c50" export "$work/first.tar.zst"
"$headroom" kernels --cache "$work/imported" import "$work/first.tar.zst"
"$headroom" kernels --cache "$work/imported" export "$work/second.tar.zst"
cmp "$work/first.tar.zst" "$work/second.tar.zst" && echo "round trip byte-identical: $(stat -c %s "$work/first.tar.zst") bytes"
hyperfine --warmup 1 --runs 10 --prepare "rm -rf $work/imp2" --export-json "$work/bundle.json" \
  "$headroom kernels --cache $work/c50 export $work/x.tar.zst" \
  "$headroom kernels --cache $work/imp2 import $work/first.tar.zst"
medians "$work/bundle.json"
