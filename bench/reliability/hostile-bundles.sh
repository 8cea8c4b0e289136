#!/usr/bin/env bash
# Every kind of hostile kernel bundle against `headroom kernels import` (the release binary):
# each must exit 2 with a refusal on stderr and leave the cache exactly as it was. Prints one
# line per kind with the import's wall time and peak RSS (GNU time), then the figure
#   N of N hostile bundles refused, cache unchanged
# The bundles are written by crates/headroom-kernels/tests/integration/hostile_bundles.rs, which checks
# each refusal's message in-process too.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -x /usr/bin/time ]; then
  echo "hostile-bundles: needs GNU time at /usr/bin/time (apt-get install time)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bundles"
HEADROOM_HOSTILE_BUNDLES_DIR="$work/bundles" cargo test --release -q -p headroom-kernels \
  --test integration -- every_hostile --nocapture 2>"$work/kinds" >/dev/null
cargo build --release -q -p headroom
headroom=$PWD/target/release/headroom
cache=$work/cache
"$headroom" kernels --cache "$cache" ls >/dev/null
listing() { (cd "$cache" && find . -printf '%p %y %s\n' | sort); }
before=$(listing)

total=0
refused=0
printf '%-80s %5s %9s %12s\n' kind exit wall 'peak RSS'
for bundle in "$work"/bundles/*.tar.zst; do
  index=$(basename "$bundle" .tar.zst)
  kind=$(sed -n "s/^$index \(.*\): [0-9]*-byte bundle.*/\1/p" "$work/kinds")
  code=0
  /usr/bin/time -v -o "$work/time" "$headroom" kernels --cache "$cache" import "$bundle" \
    >/dev/null 2>"$work/stderr" || code=$?
  wall=$(sed -n 's/.*Elapsed (wall clock) time.*: //p' "$work/time")
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time")
  total=$((total + 1))
  if [ "$code" = 2 ] && grep -q '^headroom: error: .*refusing bundle: ' "$work/stderr" \
    && [ "$(listing)" = "$before" ]; then
    refused=$((refused + 1))
  else
    echo "NOT REFUSED (exit $code): $kind: $(cat "$work/stderr")" >&2
  fi
  printf '%-80s %5s %9s %9s KiB\n' "${kind:0:80}" "$code" "$wall" "$rss"
done
echo "$refused of $total hostile bundles refused, cache unchanged"
[ "$refused" = "$total" ]
