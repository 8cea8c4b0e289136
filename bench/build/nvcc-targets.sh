#!/usr/bin/env bash
# How nvcc's memory grows with its `-gencode` targets and `--threads` (issue 39's candidate
# multipliers for a cold nvcc prior): one real CUDA unit, causal-conv1d 1.7.0's forward
# kernels (from its PyPI sdist, checked by sha256), compiled against torch 2.15's headers for
# 1, 2 and 3 targets, one at a time (`--threads 1`) and all at once. Each compile runs under
# `headroom run`, whose peak is the whole process tree's (nvcc, its cicc and ptxas processes).
# Then the three targets at once under a memory cgroup of CAP (default 900M), where they run
# out of memory: `headroom build -- make` without and with `--lower-flags`, whose rung for
# nvcc builds one target at a time.
# Usage: bench/build/nvcc-targets.sh   (needs the toolchain of .ci/cuda.sh, a release build;
# the capped builds need root or a delegated cgroup, and are skipped without one; KEEP_LOGS=DIR
# keeps their logs there)
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/lib.sh
script_name=nvcc-targets.sh
# shellcheck source=bench/build/cgroups.sh
source bench/build/cgroups.sh
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
work_dir=$work
made_cgroups=()
trap cleanup EXIT
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

# The three targets at once, as a build makes it, under the cap.
cap=${CAP:-900M}
setup_cgroups
printf 'fwd.o:\n\tnvcc %s -c %s -o fwd.o\n' "${flags[*]} ${targets[*]} --threads 3" \
  "$src/causal_conv1d_fwd.cu" >"$work/Makefile"
echo
echo "Under a $cap memory cgroup (v$cgroup_version), three targets with --threads 3:"
echo
echo "| command | exit | seconds | kernel OOM kills | lowered flags |"
echo "|---|---:|---:|---:|---|"
for lower in "" --lower-flags; do
  make_cgroup "$(size_to_bytes "$cap")"
  rm -f "$work/fwd.o" "$work/report.json"
  start=$(date +%s.%N)
  status=0
  HEADROOM_STATE_DIR=$work/state bash -c 'echo $$ >"$1/cgroup.procs" && cd "$2" && shift 2 && exec "$@"' \
    capped "$cgroup" "$work" "$headroom" build $lower --report report.json -- make \
    >"$work/build.log" 2>&1 || status=$?
  [ -z "${KEEP_LOGS:-}" ] || cp "$work/build.log" "$KEEP_LOGS/build${lower}.log"
  seconds=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  lowered=$(python3 -c '
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
print(jobs[0].get("lowered_flags") or "none" if jobs else "no job")' "$work/report.json")
  echo "| headroom build $lower -- make | $status | $seconds | $(cgroup_oom_kills "$cgroup") | $lowered |"
done
