"""Times commands side by side, alternating them run after run so that drift on a noisy
machine hits each alike, and prints their medians as JSON (hyperfine's --export-json shape).

Usage: python3 alternate.py RUNS OUT.json NAME=COMMAND [NAME=COMMAND ...]

A COMMAND is split as a shell would split it and run without a shell. A NAME ending in
`-unpreloaded` runs with LD_PRELOAD removed from its environment. With GAP_MS set, each run
waits that long first, as a build's compiler calls come apart from each other (back to back,
a cost the kernel pays once per burst of calls is paid once for them all).
"""
import json
import os
import shlex
import statistics
import subprocess
import sys
import time


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
            time.sleep(gap)
            start = time.perf_counter()
            subprocess.run(shlex.split(command), env=env, check=True)
            times[name].append(time.perf_counter() - start)
    results = [{"command": name, "median": statistics.median(values)} for name, values in times.items()]
    with open(out, "w") as file:
        json.dump({"results": results}, file)


main()
