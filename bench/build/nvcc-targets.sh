#!/usr/bin/env bash
# How nvcc's memory grows with its `-gencode` targets and `--threads` (issue 39's candidate
# multipliers for a cold nvcc prior): one real CUDA unit, causal-conv1d 1.7.0's forward
# kernels (from its PyPI sdist, checked by sha256), compiled against torch 2.15's headers for
# 1, 2 and 3 targets, one at a time (`--threads 1`) and all at once. Each compile runs under
# `headroom run`, whose peak is the whole process tree's (nvcc, its cicc and ptxas processes).
# Usage: bench/build/nvcc-targets.sh   (needs the toolchain of .ci/cuda.sh, a release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/lib.sh
headroom=${HEADROOM:-$PWD/target/release/headroom}
[ -x "$headroom" ] || { echo "needs $headroom: cargo build --release -p headroom"; exit 2; }
env_dir="${HEADROOM_CUDA_ENV:-$HOME/.cache/headroom-ci}"
bash .ci/cuda.sh >/dev/null
site=$(echo "$env_dir"/venv/lib/python3*/site-packages)
export PATH=$env_dir/cuda-home/bin:$PATH

cache=${XDG_CACHE_HOME:-$HOME/.cache}/headroom-bench/causal-conv1d
name=causal_conv1d-1.7.0.tar.gz
sha=3202758494eaa7b597ce1c282dfa188889506bfcb92cad3c407d26736bfcd32b
pypi_download causal-conv1d "$name" "$sha" "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$cache/$name" -C "$work"
src=$work/causal_conv1d-1.7.0/csrc

# The flags causal-conv1d's setup.py gives nvcc, with torch 2.15's C++20.
flags=(-std=c++20 -O3 -Xcompiler -fPIC -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__
  -U__CUDA_NO_BFLOAT16_CONVERSIONS__ -U__CUDA_NO_BFLOAT16_OPERATORS__ --expt-relaxed-constexpr
  --expt-extended-lambda --use_fast_math -DTORCH_EXTENSION_NAME=causal_conv1d_cuda
  -I"$src" -I"$site/torch/include" -I"$site/torch/include/torch/csrc/api/include"
  $(python3-config --includes))
targets=(-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
  -gencode arch=compute_100,code=sm_100)

echo "| targets | --threads | seconds | peak MiB | peak ÷ one target's |"
echo "|---:|---:|---:|---:|---:|"
one=
for run in "1 1" "2 1" "2 2" "3 1" "3 3"; do
  read -r count threads <<<"$run"
  "$headroom" run --json "$work/run.json" -- nvcc "${flags[@]}" "${targets[@]:0:$((2 * count))}" \
    --threads "$threads" -c "$src/causal_conv1d_fwd.cu" -o "$work/fwd.o" >/dev/null 2>&1
  read -r seconds peak < <(python3 -c '
import json, sys
rung = json.load(open(sys.argv[1]))["rungs"][0]
print(round(rung["duration_s"], 1), rung["peak"]["rss"] >> 20)' "$work/run.json")
  one=${one:-$peak}
  echo "| $count | $threads | $seconds | $peak | $(python3 -c "print(f'{$peak / $one:.2f}')") |"
done
