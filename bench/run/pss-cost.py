#!/usr/bin/env python3
"""What reading PSS costs against RSS, for a tree of 20 forked processes.

A parent fills SIZE MiB (default 380, an idle Inductor compile worker's RSS), forks 19 children
that sleep, and times one read of /proc/PID/stat (what RSS costs headroom) and one of
/proc/PID/smaps_rollup (what PSS costs) for all 20, median of ROUNDS rounds. With torch's
venv python and --torch, the parent imports torch first, as Inductor's workers do, which adds
the many mappings of its libraries.

usage: pss-cost.py [SIZE_MIB] [ROUNDS] [--torch]
"""
import os, statistics, sys, time

args = [a for a in sys.argv[1:] if not a.startswith("--")]
size = int(args[0]) if args else 380
rounds = int(args[1]) if len(args) > 1 else 20
if "--torch" in sys.argv:
    import torch  # noqa: F401

held = b"x" * (size << 20)
children = []
for _ in range(19):
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    children.append(pid)
pids = [os.getpid()] + children


def per_round(name):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for pid in pids:
            with open(f"/proc/{pid}/{name}") as f:
                f.read()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


try:
    stat = per_round("stat")
    pss = per_round("smaps_rollup")
    print(f"tree of {len(pids)} processes, {size} MiB shared, torch={'--torch' in sys.argv}")
    print(f"  RSS (stat) for the tree:         {stat:8.2f} ms a sample")
    print(f"  PSS (smaps_rollup) for the tree: {pss:8.2f} ms a sample")
    # headroom reads each process's PSS at most every 5 s (procmem::PSS_FRESH).
    print(f"  PSS as headroom reads it, at 10 samples/s: {pss / 50:8.2f} ms a sample on average")
finally:
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
