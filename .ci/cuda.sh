#!/usr/bin/env bash
# Installs a real CUDA toolchain and PyTorch from PyPI, for the tests and benchmarks that
# build CUDA code (no GPU is needed to compile), and prints where they are:
#
#   ENV/venv        a virtual environment with torch 2.15.0 (a CUDA 13.2 build), nvcc 13.2
#                   (cuda-toolkit[nvcc]), ninja, setuptools and wheel
#   ENV/cuda-home   a CUDA_HOME that nvcc, torch's cpp_extension and torch's CMake package
#                   accept, made of links into the wheels' shared tree (site-packages/nvidia/cu13)
#
# ENV is $HEADROOM_CUDA_ENV, by default ~/.cache/headroom-ci; pip's downloads are cached in
# ~/.cache/pip, so a second run installs nothing new. The tests find ENV the same way.
set -euo pipefail
env_dir="${HEADROOM_CUDA_ENV:-$HOME/.cache/headroom-ci}"
venv="$env_dir/venv"
cuda_home="$env_dir/cuda-home"

if ! "$venv/bin/python" -c 'import torch' 2>/dev/null ||
   ! compgen -G "$venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc" >/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "torch==2.15.0" "cuda-toolkit[nvcc]==13.2.2" ninja setuptools wheel
fi

cu13="$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)"
[ -x "$cu13/bin/nvcc" ] || { echo "cuda.sh: no nvcc in $cu13" >&2; exit 1; }
rm -rf "$cuda_home.tmp"
mkdir -p "$cuda_home.tmp/lib64"
for part in bin include nvvm; do ln -s "$cu13/$part" "$cuda_home.tmp/$part"; done
for library in "$cu13"/lib/*; do ln -s "$library" "$cuda_home.tmp/lib64/"; done
# The wheels ship versioned names only; linkers and CMake's FindCUDA look for libX.so.
for library in "$cuda_home.tmp"/lib64/lib*.so.*; do
  unversioned="${library%%.so.*}.so"
  [ -e "$unversioned" ] || ln -s "$(basename "$library")" "$unversioned"
done
ln -s lib64 "$cuda_home.tmp/lib"
rm -rf "$cuda_home"
mv "$cuda_home.tmp" "$cuda_home"
echo "cuda.sh: venv $venv, CUDA_HOME $cuda_home ($("$cuda_home/bin/nvcc" --version | tail -1))"
