#!/usr/bin/env python3
"""Admission that looks H seconds ahead and kills to make room, on flash-attention 16c/32G
(BENCHMARKS.md, "Where the targets are missed").

`parallel --memfree` beats headroom there by admitting whenever memory is free now and
killing the youngest job when it runs short. This idealised replay asks whether a rule
between the two does better than either: with every job's exact memory curve (highest use
per 1 s step, as in order_study.py), a 30 GiB budget and 16 slots, the next job in
longest-first order starts when it fits beside the running jobs' curves for the next H
seconds; each second, while the running jobs' curves do not fit the next 3 s, the youngest
is killed and queued again at the front. H as long as any job is greedy admission, which
never kills. `--memfree` is replayed too: start the next job in the build's order while
free memory (of 32 GiB) is above the largest peak, kill the youngest below half of it.
Six draws of +-3% on each job's length and peak; prints each rule's median makespan and
its kills and work lost per draw.

Usage: python3 bench/sim/horizon_study.py [TRACE]   (needs numpy: apt-get install python3-numpy)
"""
import random
import sys

import numpy as np

from order_study import BUDGET, DRAWS, GIB, SLOTS, draw, load

CAPACITY = 32 * GIB
# Seconds ahead a kill looks: the sampler sees a shortfall a moment before it comes.
REACT = 3
HORIZONS = [10, 20, 40, 60, 90, 120, None]


def replay(order, curves, deps, admits, short):
    """Runs `order`: `admits(running, job, now)` says whether a job may start,
    `short(running, now)` whether the youngest running job must be killed. Returns the
    makespan, the kills and the seconds of work they threw away."""
    running = {}  # job -> start second
    ends = {}
    queue = list(order)
    now = kills = wasted = 0
    while len(ends) < len(curves):
        for job, start in list(running.items()):
            if now - start >= len(curves[job]):
                ends[job] = start + len(curves[job])
                del running[job]
        while len(running) > 1 and short(running, now):
            youngest = max(running, key=lambda job: (running[job], job))
            wasted += now - running.pop(youngest)
            kills += 1
            queue.insert(0, youngest)
        while len(running) < SLOTS and queue:
            job = queue[0]
            if any(ends.get(dep, now + 1) > now for dep in deps[job]):
                break
            if running and not admits(running, job, now):
                break
            running[job] = now
            queue.pop(0)
        now += 1
    return max(ends.values()), kills, wasted


def planned(curves, running, now, steps):
    """Bytes the running jobs use in each of the next `steps` seconds."""
    total = np.zeros(steps)
    for job, start in running.items():
        ahead = curves[job][now - start:now - start + steps]
        total[:len(ahead)] += ahead
    return total


def main(path):
    jobs, exact, deps, units, rest = load(path)
    largest = max(job["peak"] for job in jobs)
    results = {}
    for seed in range(DRAWS):
        curves = draw(exact, random.Random(seed))

        def used(running, now):
            return sum(curves[job][now - start] for job, start in running.items())

        memfree = replay(units + rest, curves, deps,
                         lambda running, job, now: CAPACITY - used(running, now) > largest,
                         lambda running, now: CAPACITY - used(running, now) < largest / 2)
        results.setdefault("parallel --memfree", []).append(memfree)
        longest_first = sorted(units, key=lambda i: -len(curves[i])) + rest

        def short(running, now):
            return bool(np.any(planned(curves, running, now, REACT) > BUDGET))

        for horizon in HORIZONS:

            def admits(running, job, now, horizon=horizon):
                steps = len(curves[job]) if horizon is None else min(horizon, len(curves[job]))
                need = planned(curves, running, now, steps) + curves[job][:steps]
                return bool(np.all(need <= BUDGET))

            name = "greedy (whole life)" if horizon is None else f"H = {horizon} s"
            results.setdefault(name, []).append(
                replay(longest_first, curves, deps, admits, short))
    for name, runs in results.items():
        spans = [run[0] for run in runs]
        print(f"{name}: median {np.median(spans):.0f} s; (makespan, kills, work lost) per draw "
              f"{runs}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "traces/flash-attention.json")
