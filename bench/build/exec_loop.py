"""Times a shell loop of 1,000 `/bin/true` with the environment it is given (inside a
`headroom build`: the interceptor preloaded) and with LD_PRELOAD removed, alternating the
two so that drift on a noisy machine hits both alike. Prints the medians as JSON.

Usage: python3 exec_loop.py RUNS OUT.json
"""
import json
import os
import statistics
import subprocess
import sys
import time

LOOP = "for i in $(seq 1000); do /bin/true; done"


def timed(env):
    start = time.perf_counter()
    subprocess.run(["sh", "-c", LOOP], env=env, check=True)
    return time.perf_counter() - start


def main():
    runs, out = int(sys.argv[1]), sys.argv[2]
    governed = dict(os.environ)
    direct = {k: v for k, v in governed.items() if k != "LD_PRELOAD"}
    times = {"direct": [], "governed": []}
    for _ in range(runs):
        times["direct"].append(timed(direct))
        times["governed"].append(timed(governed))
    medians = {name: statistics.median(values) for name, values in times.items()}
    json.dump({"results": [{"command": k, "median": v} for k, v in medians.items()]}, open(out, "w"))


main()
