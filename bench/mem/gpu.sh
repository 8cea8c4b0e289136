#!/usr/bin/env bash
# headroom-mem on a GPU machine, as one script of a few minutes: the CUDA backend's tests
# (pinned memory, eviction), the Python package on the GPU beside PyTorch (DLPack with torch
# and cupy, copy bandwidth, a training loop in a headroom_mem.torch.MemPool, offload and
# restore of a tag), and alloc/free pairs on 1-8 threads against PyTorch's caching allocator.
#
#   bash bench/mem/gpu.sh CARRY OUT     # CARRY from bench/mem/gpu-prepare.sh
#
# The machine needs python3 with torch (CUDA), numpy and pytest, optionally cupy; nothing is
# downloaded. Results go to OUT (gpu.json, pairs-*.txt) and to stdout. Each step has a time
# limit and the script goes on past a failed step, so one run reports all it can.
set -uo pipefail
cd "$(dirname "$0")/../.."
carry=${1:?usage: gpu.sh CARRY OUT}
out=${2:?usage: gpu.sh CARRY OUT}
mkdir -p "$out"
status=0
step() { echo; echo "== $*"; }
limited() { timeout --kill-after 10 "$@"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "cpus: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"

step "Rust: the CUDA backend's tests"
limited 120 "$carry/cuda-tests" cuda:: --nocapture --test-threads 1 || status=1

step "Python: the wheel, installed beside the machine's torch (which may itself live in a venv)"
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" "$carry"/headroom_mem-*.whl || status=1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step "Python: pytest of the package on this machine"
limited 180 python3 -m pytest -q -p no:cacheprovider crates/headroom-mem-py/tests || status=1

step "Python: CUDA backend, copies, training loop, offload, release, whole allocator"
limited 300 python3 bench/mem/gpu_bench.py --json "$out/gpu.json" || status=1

step "Alloc/free pairs on 1, 2, 4, 8 threads: headroom-mem's CUDA pool, then PyTorch's"
limited 120 "$carry/pairs" --backend cuda --reps 5 | tee "$out/pairs-headroom.txt" || status=1
limited 240 python3 bench/mem/torch_pairs.py | tee "$out/pairs-torch.txt" || status=1

echo
echo "gpu.sh: $([ $status = 0 ] && echo OK || echo 'FAILED (see above)')"
exit $status
