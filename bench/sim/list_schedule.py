#!/usr/bin/env python3
"""What list scheduling can reach on a CPU-bound trace, memory aside (BENCHMARKS.md).

List scheduling: whenever a job ends, start ready jobs in priority order as long as their
threads fit on the cores (a job always starts on an idle machine), so no job is ever slowed
by oversubscription. Memory is ignored, so no policy that admits by memory does better in
the same order. Priorities tried: the longest chain of work from each job first (headroom's
order), chain × threads, and the best of 200 chain orders perturbed by up to ±30%.

Usage: python3 bench/sim/list_schedule.py [TRACE] [CORES]
       (default traces/rustc-heavy.json on 16 cores; about 2 s)
"""
import json
import random
import sys


class Trace:
    def __init__(self, path):
        jobs = json.load(open(path))["jobs"]
        self.count = len(jobs)
        self.seconds = [job["duration"] for job in jobs]
        self.threads = [job["cpu"] / job["duration"] for job in jobs]
        self.deps = [job.get("deps", []) for job in jobs]
        self.cpu = sum(job["cpu"] for job in jobs)
        # Each job's own seconds plus the longest chain that waits on it; dependencies point
        # to earlier jobs, so one pass from the back finds them.
        waiting_on = [[] for _ in range(self.count)]
        for job, inputs in enumerate(self.deps):
            for dep in inputs:
                waiting_on[dep].append(job)
        self.chain = [0.0] * self.count
        for job in reversed(range(self.count)):
            later = (self.chain[k] for k in waiting_on[job])
            self.chain[job] = self.seconds[job] + max(later, default=0.0)

    def makespan(self, priority, cores):
        """List scheduling on `cores` with the highest `priority` first."""
        now, done, running, started = 0.0, set(), [], set()
        while len(done) < self.count:
            ready = [j for j in range(self.count)
                     if j not in started and all(dep in done for dep in self.deps[j])]
            ready.sort(key=lambda j: -priority[j])
            busy = sum(self.threads[j] for _, j in running)
            for job in ready:
                if len(running) >= cores:
                    break
                if running and busy + self.threads[job] > cores + 1e-9:
                    continue
                running.append((now + self.seconds[job], job))
                started.add(job)
                busy += self.threads[job]
            running.sort()
            now, job = running.pop(0)
            done.add(job)
        return now


def main(path, cores):
    trace = Trace(path)
    bound = max(trace.cpu / cores, max(trace.chain))
    print(f"critical path {max(trace.chain):.1f} s, CPU work / cores {trace.cpu / cores:.1f} s")
    rng = random.Random(0)
    perturbed = min(
        trace.makespan([c * (1 + rng.uniform(-0.3, 0.3)) for c in trace.chain], cores)
        for _ in range(200))
    for name, seconds in [
        ("longest chain first", trace.makespan(trace.chain, cores)),
        ("chain x threads", trace.makespan(
            [c * t for c, t in zip(trace.chain, trace.threads)], cores)),
        ("best of 200 perturbed chain orders", perturbed),
    ]:
        print(f"{name}: {seconds:.1f} s = {seconds / bound:.3f}x of the larger")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "traces/rustc-heavy.json",
         int(sys.argv[2]) if len(sys.argv) > 2 else 16)
