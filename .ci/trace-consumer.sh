#!/usr/bin/env bash
# Installs the programs the `--trace` tests read Chrome traces back with, from npm:
#
#   @paulirish/trace_engine    the trace engine of Chrome DevTools' Performance panel, as
#                              published from DevTools: tracks (threads) and their slices
#   @tracerbench/trace-model   a model of the whole Trace Event Format: processes, threads,
#                              slices, instants and counters (DevTools reads no counters)
#
# Perfetto's trace processor would be the first choice, but its Python package downloads the
# binary at run time from outside the package registries, which CI cannot reach.
#
# DIR is $HEADROOM_TRACE_CONSUMER, by default ~/.cache/headroom-trace-consumer, and npm's
# downloads are cached in ~/.cache/npm, so a second run installs nothing. The tests find DIR
# the same way and skip, saying why, where it is missing.
set -euo pipefail
dir="${HEADROOM_TRACE_CONSUMER:-$HOME/.cache/headroom-trace-consumer}"
packages=("@paulirish/trace_engine@0.0.65" "@tracerbench/trace-model@8.0.0")

installed() {
  local package name version
  for package in "${packages[@]}"; do
    name="${package%@*}"
    version="${package##*@}"
    [ "$(node -p "require('$dir/node_modules/$name/package.json').version" 2>/dev/null)" = "$version" ] ||
      return 1
  done
}

if ! command -v npm >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nodejs npm >/dev/null
fi
if ! installed; then
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"private": true}' >"$dir/package.json"
  npm install --prefix "$dir" --cache "$HOME/.cache/npm" --no-audit --no-fund --loglevel=error \
    "${packages[@]}"
  installed || { echo "trace-consumer.sh: the install left no ${packages[*]} in $dir" >&2; exit 1; }
fi
echo "trace-consumer.sh: ${packages[*]} in $dir"
