#!/usr/bin/env python3
"""How the queue's order changes greedy admission on flash-attention 16c/32G (BENCHMARKS.md).

An idealised replay outside the simulator: every nvcc job's exact memory curve (highest use
per 1 s step, the trace's profile), a 30 GiB budget and 16 slots; a job starts when it fits
beside the running ones in every future step, in the order given, or (best fit) of all the
jobs that fit, the one whose start leaves the plan's highest step lowest. Six draws of ±3% on
each job's length and peak. Prints the makespans and their median for each order.

Usage: python3 bench/sim/order_study.py [TRACE]   (needs numpy: apt-get install python3-numpy)
"""
import json
import random
import sys

import numpy as np

GIB = 1 << 30
BUDGET = 30 * GIB
SLOTS = 16
DRAWS = 6


def curve(job):
    """Highest bytes in each 1 s step of the job's life, from its profile points."""
    points = [(0.0, 0.0)] + [tuple(p) for p in job["profile"]]
    points.append((job["duration"], job["profile"][-1][1]))
    fine = np.arange(0, job["duration"] + 0.25, 0.25)
    bytes_at = np.interp(fine, [p[0] for p in points], [p[1] for p in points])
    steps = int(np.ceil(job["duration"]))
    return np.array([bytes_at[(fine >= k) & (fine < k + 1.25)].max() for k in range(steps)])


def draw(exact, rng):
    """One run's curves: each job's `exact` curve stretched and scaled by up to ±3%."""
    curves = []
    for c in exact:
        length = max(1, round(len(c) * (1 + rng.uniform(-0.03, 0.03))))
        stretched = np.interp(np.linspace(0, len(c) - 1, length), np.arange(len(c)), c)
        curves.append(stretched * (1 + rng.uniform(-0.03, 0.03)))
    return curves


def makespan(order, curves, deps, best_fit=False):
    """Greedy admission in `order`, each job started as soon as it fits in every step; with
    `best_fit`, of all the ready jobs that fit, the one whose start leaves the plan's highest
    step over its life lowest goes first (ties in `order`)."""
    plan = np.zeros(sum(len(c) for c in curves) + 1)
    ends = {}
    running = []
    queue = list(order)
    now = 0
    while len(ends) < len(curves):
        for end, job in [r for r in running if r[0] <= now]:
            ends[job] = end
        running = [r for r in running if r[0] > now]
        while len(running) < SLOTS:
            fitting = []
            for job in queue:
                if any(ends.get(dep, now + 1) > now for dep in deps[job]):
                    continue
                total = plan[now:now + len(curves[job])] + curves[job]
                if not running or np.all(total <= BUDGET):
                    fitting.append((total.max() if best_fit else 0, job))
                    if not best_fit:
                        break
            if not fitting:
                break
            job = min(fitting, key=lambda fit: fit[0])[1]
            plan[now:now + len(curves[job])] += curves[job]
            running.append((now + len(curves[job]), job))
            queue.remove(job)
        now += 1
    return max(ends.values())


def load(path):
    """The trace's jobs, their exact curves, their dependencies, the jobs that wait for none
    (flash-attention's nvcc jobs and two API units) and the rest (the link), in trace order."""
    jobs = json.load(open(path))["jobs"]
    exact = [curve(job) for job in jobs]
    deps = [set(job.get("deps", [])) for job in jobs]
    units = [i for i, job in enumerate(jobs) if not deps[i]]
    rest = [i for i in range(len(jobs)) if deps[i]]
    return jobs, exact, deps, units, rest


def main(path):
    _, exact, deps, units, rest = load(path)
    results = {}
    for seed in range(DRAWS):
        curves = draw(exact, random.Random(seed))
        longest_first = sorted(units, key=lambda i: -len(curves[i]))
        shortest_8 = longest_first[-8:]
        orders = {
            "longest first": longest_first,
            "build order": units,
            "build order, 8 shortest last": [i for i in units if i not in shortest_8]
            + shortest_8,
        }
        for name, order in orders.items():
            results.setdefault(name, []).append(makespan(order + rest, curves, deps))
        results.setdefault("best fit", []).append(
            makespan(longest_first + rest, curves, deps, best_fit=True))
    for name, spans in results.items():
        print(f"{name}: median {np.median(spans):.0f} s, {sorted(spans)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "traces/flash-attention.json")
