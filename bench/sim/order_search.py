#!/usr/bin/env python3
"""How far any queue order can take greedy admission on flash-attention 16c/32G, knowing
every job's exact memory curve (BENCHMARKS.md).

The same idealised replay as order_study.py (1 s steps, 30 GiB, 16 slots, no run-to-run
variation): the best of RANDOM shuffled orders of the compiles, then SWAPS random swaps of
two jobs kept whenever the makespan does not grow. Prints the spread of the random orders
and the best order's makespan.

Usage: python3 bench/sim/order_search.py [RANDOM] [SWAPS]   (default 300 and 1500, about
       2 minutes; needs numpy)
"""
import json
import random
import sys

import numpy as np

from order_study import curve, makespan


def main(path, shuffles, swaps):
    jobs = json.load(open(path))["jobs"]
    curves = [curve(job) for job in jobs]
    deps = [set(job.get("deps", [])) for job in jobs]
    units = [i for i in range(len(jobs)) if not deps[i]]
    rest = [i for i in range(len(jobs)) if deps[i]]
    rng = random.Random(1)
    tried = []
    for _ in range(shuffles):
        order = rng.sample(units, len(units))
        tried.append((makespan(order + rest, curves, deps), order))
    spans = [span for span, _ in tried]
    print(f"{shuffles} random orders: best {min(spans)} s, median {np.median(spans):.0f} s, "
          f"worst {max(spans)} s")
    best, order = min(tried, key=lambda tried: tried[0])
    for _ in range(swaps):
        a, b = rng.sample(range(len(order)), 2)
        candidate = order[:]
        candidate[a], candidate[b] = candidate[b], candidate[a]
        span = makespan(candidate + rest, curves, deps)
        if span <= best:
            best, order = span, candidate
    print(f"after {swaps} swaps: {best} s")


if __name__ == "__main__":
    main("traces/flash-attention.json",
         int(sys.argv[1]) if len(sys.argv) > 1 else 300,
         int(sys.argv[2]) if len(sys.argv) > 2 else 1500)
