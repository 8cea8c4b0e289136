"""Times commands side by side, alternating them run after run so that drift on a noisy
machine hits each alike, and prints their medians as JSON (hyperfine's --export-json shape).

Usage: python3 alternate.py RUNS OUT.json NAME=COMMAND [NAME=COMMAND ...]

A COMMAND is split as a shell would split it and run without a shell. A NAME ending in
`-unpreloaded` runs with LD_PRELOAD removed from its environment.

Each run starts at a random point of the kernel's scheduler tick. On a loaded host a new
process waits for a core until the next tick at which a running task's slice has ended, so
a run that started where the one before it ended would wait by how long that other command
took, not by its own cost (a fixed 100 ms gap is 25 ticks at 250 Hz, and does the same).
So each run first waits a time drawn between 0 and 4 ms (a tick at 250 Hz, the longest
common one), or with GAP_MS set between 0.9 and 1.1 times GAP_MS, as a build's compiler
calls come apart from each other (back to back, a cost the kernel pays once per burst of
calls is paid once for them all).
"""
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time

# The longest common scheduler tick: 4 ms at 250 Hz.
TICK = 0.004


def main():
    runs, out = int(sys.argv[1]), sys.argv[2]
    variants = [argument.split("=", 1) for argument in sys.argv[3:]]
    environment = dict(os.environ)
    unpreloaded = {k: v for k, v in environment.items() if k != "LD_PRELOAD"}
    times = {name: [] for name, _ in variants}
    gap = float(os.environ.get("GAP_MS", "0")) / 1000
    for _ in range(runs):
        for name, command in variants:
            env = unpreloaded if name.endswith("-unpreloaded") else environment
            time.sleep(gap * random.uniform(0.9, 1.1) if gap else random.uniform(0, TICK))
            start = time.perf_counter()
            subprocess.run(shlex.split(command), env=env, check=True)
            times[name].append(time.perf_counter() - start)
    results = [{"command": name, "median": statistics.median(values)} for name, values in times.items()]
    with open(out, "w") as file:
        json.dump({"results": results}, file)


main()
