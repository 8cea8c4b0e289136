#!/usr/bin/env bash
# `headroom kernels resolve --fetch` of one artifact from a local S3 server (moto, installed by
# .ci/stores.sh): the time until the artifact's path is printed and the file is ready,
#   cold  the local cache empty before each run (the index and the blob come over S3),
#   warm  the artifact already cached (the index still comes over S3, the blob does not),
# against a plain local `resolve` for reference. Needs clang-19 and hyperfine; prints medians.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash .ci/stores.sh >/dev/null
cargo build --release -p headroom
headroom=$PWD/target/release/headroom
moto="${HEADROOM_STORES_ENV:-$HOME/.cache/headroom-stores}/venv/bin/moto_server"
work=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$moto" -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
moto_pid=$!
trap 'kill "$moto_pid"; rm -rf "$work"' EXIT
until python3 -c "import socket; socket.create_connection(('127.0.0.1', $port))" 2>/dev/null; do sleep 0.1; done
python3 -c "import urllib.request as r; r.urlopen(r.Request('http://127.0.0.1:$port/kernels', method='PUT'))"

export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
store="s3://kernels/bench?endpoint=http://127.0.0.1:$port"
kernels=("$headroom" kernels --manifest examples/kernels/kernels.toml)
"${kernels[@]}" --cache "$work/built" build --no-history --kernel vector_add >/dev/null
"${kernels[@]}" --cache "$work/built" --store "$store" push
artifact=$("${kernels[@]}" --cache "$work/built" resolve vector_add --device sm_89)
echo "artifact: ${artifact#"$work/built/"}, $(stat -L -c %s "$artifact") bytes"
resolve="${kernels[*]} --store '$store' resolve vector_add --device sm_89"

hyperfine -N --warmup 3 --runs 30 --prepare "rm -rf $work/cold" --export-json "$work/cold.json" \
  "$resolve --cache $work/cold --fetch"
"${kernels[@]}" --cache "$work/warm" --store "$store" resolve vector_add --device sm_89 --fetch >/dev/null
hyperfine -N --warmup 3 --runs 30 --export-json "$work/warm.json" \
  "$resolve --cache $work/warm --fetch" \
  "$resolve --cache $work/warm"
python3 bench/kernels/medians.py "$work/cold.json"
python3 bench/kernels/medians.py "$work/warm.json"
