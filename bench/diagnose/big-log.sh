#!/usr/bin/env bash
# `headroom diagnose` on a 100 MB build log, side by side with reading it (`cat > /dev/null`)
# and counting its lines (`wc -l`): medians of RUNS timed runs each, after one warm-up read so
# all three read from the page cache, and headroom's maximum RSS. Target: at most 1 s, and
# memory that does not grow with the log.
#
# The log is generated, deterministic and realistic: ninja compile lines, g++ warnings with
# their source excerpts and carets, CMake and pip chatter, a long nvcc or link command line
# (16-200 KiB) every few thousand lines, and six failures that `headroom diagnose` must all
# find: five spread through it (a CUDA OOM with its numbers, a killed cc1plus, a full disk, a
# Python MemoryError, a killed linker) and, at the end as in a pasted dmesg, the kernel's three
# lines for the OOM kill behind them.
#
# Usage: bench/diagnose/big-log.sh        (from the repository root, after
#                                          `cargo build --release -p headroom`)
#        HEADROOM=path/to/headroom SIZE_MB=100 RUNS=5 LOG=keep/it/here.log bench/diagnose/big-log.sh
set -euo pipefail
HEADROOM=${HEADROOM:-target/release/headroom}
SIZE_MB=${SIZE_MB:-100}
RUNS=${RUNS:-5}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
log=${LOG:-$scratch/build.log}

python3 - "$log" "$SIZE_MB" <<'PY'
import random, sys

path, size_mb = sys.argv[1], int(sys.argv[2])
target = size_mb * 1000 * 1000
rng = random.Random(19)
dirs = ["aten/src/ATen/native", "torch/csrc/autograd", "torch/csrc/jit/passes", "c10/core",
        "caffe2/serialize", "third_party/fmt/src", "csrc/flash_attn/src"]
words = ["tensor", "kernel", "dispatch", "autograd", "graph", "fusion", "quantized", "sparse",
         "reduce", "scatter", "layer_norm", "attention", "conv", "pool", "embedding"]
failures = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.26 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.32 GiB is free. Including non-PyTorch memory, this process has 22.31 GiB memory in use. Of the allocated memory 19.02 GiB is allocated by PyTorch, and 2.84 GiB is reserved by PyTorch but unallocated.",
    "g++: fatal error: Killed signal terminated program cc1plus",
    "OSError: [Errno 28] No space left on device",
    "MemoryError",
    "collect2: fatal error: ld terminated with signal 9 [Killed]",
    "[ 8812.412345] cc1plus invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0\n"
    "[ 8812.498765] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/build,task_memcg=/build,task=cc1plus,pid=41234,uid=1000\n"
    "[ 8812.501122] Memory cgroup out of memory: Killed process 41234 (cc1plus) total-vm:3970108kB, anon-rss:3090636kB, file-rss:4kB, shmem-rss:0kB, UID:1000 pgtables:6548kB oom_score_adj:0",
]
# The first five failures at these fractions of the log; the kernel's record at its end.
marks = [0.13, 0.29, 0.41, 0.58, 0.72]

def source():
    return f"{rng.choice(dirs)}/{rng.choice(words)}_{rng.choice(words)}_{rng.randrange(400)}.cpp"

def long_line():
    kind = rng.random()
    n = rng.randrange(16, 200) * 1024
    if kind < 0.5:
        head = "/usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME=flash_attn_2_cuda -I/src/csrc/cutlass/include "
        body = " ".join(f"-gencode arch=compute_{a},code=sm_{a}" for a in (80, 86, 89, 90) for _ in range(n // 160 + 1))
    else:
        head = "[4120/4121] Linking CXX shared library lib/libtorch_cpu.so && /usr/bin/c++ -fPIC -O3 -shared -o lib/libtorch_cpu.so "
        body = " ".join(f"caffe2/CMakeFiles/torch_cpu.dir/{source()}.o" for _ in range(n // 60 + 1))
    return (head + body)[:n]

with open(path, "w") as out:
    written, line_no, step, total_steps, next_mark = 0, 0, 0, 45000, 0
    while written < target:
        if next_mark < len(marks) and written >= marks[next_mark] * target:
            text = failures[next_mark]
            next_mark += 1
        else:
            r = rng.random()
            if r < 0.55:
                step = step % total_steps + 1
                text = f"[{step}/{total_steps}] Building CXX object caffe2/CMakeFiles/torch_cpu.dir/{source()}.o"
            elif r < 0.75:
                src, ln, col = source(), rng.randrange(1, 4000), rng.randrange(1, 80)
                var = rng.choice(words)
                text = (f"/src/pytorch/{src}:{ln}:{col}: warning: unused variable '{var}' [-Wunused-variable]\n"
                        f" {ln:>5} |   auto {var} = at::empty({{{rng.randrange(1, 4096)}, {rng.randrange(1, 4096)}}}, options);\n"
                        f"       |        ^~~~")
            elif r < 0.85:
                text = f"-- Looking for {rng.choice(words)}_{rng.randrange(999)} - found"
            elif r < 0.95:
                text = f"  copying build/lib.linux-x86_64-cpython-312/torch/{rng.choice(words)}/{rng.choice(words)}.py -> build/bdist"
            elif r < 0.9995:
                text = f"In file included from /src/pytorch/{source()}:{rng.randrange(1, 60)}:"
            else:
                text = long_line()
        out.write(text + "\n")
        written += len(text) + 1
    # The kernel's record of the kill comes last, as a pasted dmesg would.
    out.write(failures[-1] + "\n")
PY

bytes=$(stat -c %s "$log")
lines=$(wc -l <"$log")
cat "$log" >/dev/null   # warm the page cache

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
# Seconds one command takes, RUNS times.
times() {
    for _ in $(seq "$RUNS"); do
        python3 - "$@" <<'PY'
import subprocess, sys, time
start = time.perf_counter()
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(f"{time.perf_counter() - start:.4f}")
PY
    done | median
}

diagnose=$(times "$HEADROOM" diagnose "$log")
read_only=$(times cat "$log")
count=$(times wc -l "$log")
# Largest RSS of one run, in KiB.
if [ -x /usr/bin/time ]; then
    rss_kib=$(/usr/bin/time -f %M "$HEADROOM" diagnose "$log" 2>&1 >/dev/null | tail -1)
else
    rss_kib=$(python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$HEADROOM" diagnose "$log")
fi
set +e
"$HEADROOM" diagnose --json "$log" >"$scratch/found.json"
code=$?
set -e
found=$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(len(r["findings"]), r["summary"]["root_cause"])' "$scratch/found.json")

echo "log: $log, $bytes bytes, $lines lines; findings: $found; exit $code"
echo "times are medians of $RUNS runs from the page cache"
echo
echo "| log | headroom diagnose | cat > /dev/null | wc -l | diagnose / cat | diagnose / wc -l | max RSS |"
echo "|---|---|---|---|---|---|---|"
python3 - "$bytes" "$lines" "$diagnose" "$read_only" "$count" "$rss_kib" "$RUNS" <<'PY'
import sys
size, lines, diagnose, cat, wc, rss, runs = sys.argv[1:]
diagnose, cat, wc = float(diagnose), float(cat), float(wc)
print(f"| {int(size) / 1e6:.0f} MB, {int(lines):,} lines | {diagnose:.3f} s | {cat:.3f} s | {wc:.3f} s "
      f"| {diagnose / cat:.1f}x | {diagnose / wc:.1f}x | {int(rss) / 1024:.1f} MiB |")
PY
