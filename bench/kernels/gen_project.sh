#!/usr/bin/env bash
# Writes a kernel project of N CUDA kernels (6 targets each) into DIR, built with clang.
# Usage: bench/kernels/gen_project.sh DIR N
set -euo pipefail
dir=$1
count=$2
mkdir -p "$dir/include"
printf '#pragma once\n#define SCALE 2.0f\n' > "$dir/include/common.h"
: > "$dir/kernels.toml"
for ((i = 0; i < count; i++)); do
  cat > "$dir/k$i.cu" <<CU
#include "common.h"
extern "C" __global__ void k$i(float *out, const float *in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * SCALE + $i.0f;
}
CU
  cat >> "$dir/kernels.toml" <<TOML
[kernel.k$i]
language = "cuda"
sources = ["k$i.cu"]
targets = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90a", "compute_90"]
include-dirs = ["include"]
toolchain = ["clang"]

TOML
done
